"""Keep a process of the ML environment on the generation it started in.

mlstack_venv (/opt/mlstack) is a symlink to the live generation, and Python keeps that path as
sys.prefix, so a module imported after a switch would come from the new generation while the
ones imported before came from the old: two versions of one stack in one process. site.py
imports this module at start-up (provisioner_generation.pth); it resolves the link once, in the
import path, so every later import comes from the same generation. Written by provisioner
(role mlstack).
"""

import os
import sys


def pin(prefix: str = sys.prefix, path: list = sys.path) -> None:
    real = os.path.realpath(prefix)
    if real == prefix:
        return
    inside = prefix.rstrip(os.sep) + os.sep
    path[:] = [real + entry[len(prefix) :] if entry == prefix or entry.startswith(inside) else entry for entry in path]


pin()

"""Keep a process of the ML environment on the generation it started in.

mlstack_venv (/opt/mlstack) is a symlink to the live generation, and Python keeps that path as
sys.prefix, so a module imported after a switch would come from the new generation while the
ones imported before came from the old: two versions of one stack in one process. site.py
imports this module at start-up (provisioner_generation.pth). It resolves the link once: in the
import path, so every later import comes from the same generation, and in sys.executable, so
the processes it starts (multiprocessing, joblib's workers, subprocesses of sys.executable) run
on it too. It keeps the generation's directory open while the process lives, which is how the
role sees that a job still runs from a generation and keeps it. Written by provisioner (role
mlstack).
"""

import contextlib
import os
import sys

_held = None  # the open directory of this process's generation


def pin(prefix: str = sys.prefix, path: list = sys.path) -> str:
    """The generation PREFIX resolves to; PATH (the import path) and sys.executable pinned to it."""
    real = os.path.realpath(prefix)
    if real == prefix:
        return real
    inside = prefix.rstrip(os.sep) + os.sep
    path[:] = [real + entry[len(prefix):] if entry == prefix or entry.startswith(inside) else entry for entry in path]
    if sys.executable.startswith(inside):
        sys.executable = real + sys.executable[len(prefix):]
    return real


def hold(directory: str) -> None:
    global _held
    with contextlib.suppress(OSError):
        _held = os.open(directory, os.O_RDONLY | os.O_DIRECTORY | os.O_CLOEXEC)


hold(pin())

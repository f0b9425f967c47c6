"""Role allocator's option checks, run for real with ansible-playbook on localhost (the
preflight reads options only): a jemalloc option string passes, one with a space, a quote or
a backslash is refused naming the option."""

from __future__ import annotations

import json
import os
import subprocess
import sys
from pathlib import Path

import plugin_code
import pytest
import yaml

ROOT = Path(__file__).resolve().parents[2]
BIN = Path(sys.executable).parent


@pytest.mark.parametrize(
    ("conf", "refused"),
    [("background_thread:true,dirty_decay_ms:10000", False), ("a b", True), ('a"b', True), ("a\\b", True)],
)
def test_malloc_conf_is_one_option_string(tmp_path, conf, refused):
    book = tmp_path / "play.yml"
    book.write_text(yaml.safe_dump([{"name": "Preflight", "hosts": "localhost", "connection": "local", "gather_facts": False,
                                     "tasks": [{"ansible.builtin.include_role": {"name": "allocator", "tasks_from": "preflight"}}]}]))
    extra = tmp_path / "vars.json"
    extra.write_text(json.dumps({"allocator_malloc_conf": conf}))
    env = {**os.environ, "PATH": f"{BIN}:{os.environ['PATH']}", "ANSIBLE_ROLES_PATH": str(ROOT / "roles"),
           "ANSIBLE_FILTER_PLUGINS": str(plugin_code.PLUGINS / "filter"), "ANSIBLE_LOCALHOST_WARNING": "false",
           "ANSIBLE_INVENTORY_UNPARSED_WARNING": "false", "ANSIBLE_PYTHON_INTERPRETER": sys.executable, "ANSIBLE_NOCOLOR": "1"}
    r = subprocess.run([str(BIN / "ansible-playbook"), "-i", "localhost,", "-e", f"@{extra}", str(book)],
                       capture_output=True, text=True, timeout=120, env=env)
    assert (r.returncode != 0) == refused, r.stdout[-2000:]
    assert ("allocator_malloc_conf must be one jemalloc option string" in r.stdout) == refused, r.stdout[-2000:]

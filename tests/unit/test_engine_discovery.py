"""Under Mitogen, Python discovery on a host that does not answer costs one connection timeout,
not one per interpreter name (plugins/strategy/_discovery.py); names that are not there are
still tried in turn. Mitogen's own loop runs here, over a connection that fails as Mitogen's does."""

from __future__ import annotations

import importlib.util
import types
from typing import Any

import ansible.errors
import ansible_mitogen.mixins
import pytest

from provisioner import paths


def discovery():
    spec = importlib.util.spec_from_file_location("provisioner_test_discovery", paths.PLUGINS / "strategy" / "_discovery.py")
    assert spec and spec.loader
    module = importlib.util.module_from_spec(spec)
    spec.loader.exec_module(module)
    return module


CANDIDATES = ["python3.13", "python3.12", "python3.11", "/usr/bin/python3", "python3"]


class Connection:
    """exec_command as Mitogen's connection answers it: a failure per name, or the output."""

    def __init__(self, failures: dict[str, str]):
        self.failures = failures
        self.tried: list[str] = []
        self.action: object = None

    def exec_command(self, cmd, in_data, sudoable, mitogen_chdir=None):
        name = self.action._mitogen_interpreter_candidate  # type: ignore[attr-defined]
        self.tried.append(name)
        if name in self.failures:
            raise ansible.errors.AnsibleConnectionFailure(self.failures[name])
        return 0, b"FOUND\n/usr/bin/python3.11\nENDFOUND\n", b""


def action(connection: Connection, install: bool = True):
    mixin = type("Mixin", (ansible_mitogen.mixins.ActionModuleMixin,), {})
    if install:
        discovery().install(types.SimpleNamespace(ActionModuleMixin=mixin))
    act: Any = object.__new__(mixin)
    act._play_context = types.SimpleNamespace(executable=None)
    act._connection = connection
    act._mitogen_discovering_interpreter = True
    act._mitogen_interpreter_candidates = list(CANDIDATES)
    connection.action = act
    return act


def not_found(name: str) -> str:
    return f"EOF on stream; last 100 lines received:\nbash: line 1: {name}: command not found"


def test_names_that_are_not_there_are_tried_in_turn():
    conn = Connection({n: not_found(n) for n in CANDIDATES[:2]})
    act = action(conn)
    assert act._low_level_execute_command("echo FOUND")["rc"] == 0
    assert conn.tried == ["python3.13", "python3.12", "python3.11"]
    assert act._mitogen_interpreter_candidates == CANDIDATES


@pytest.mark.parametrize(
    "message",
    [
        "Connection timed out.",
        "EOF on stream; last 100 lines received:\nssh: connect to host 10.213.250.2 port 22: Connection refused",
        "EOF on stream; last 100 lines received:\nroot@10.213.8.2: Permission denied (publickey).",
    ],
)
def test_a_host_that_cannot_be_reached_fails_at_the_first_name(message: str):
    conn = Connection(dict.fromkeys(CANDIDATES, message))
    with pytest.raises(ansible.errors.AnsibleConnectionFailure, match=message.split("\n")[-1][:20]):
        action(conn)._low_level_execute_command("echo FOUND")
    assert conn.tried == ["python3.13"]


def test_without_it_mitogen_tries_every_name_on_a_host_that_does_not_answer():
    """What the timeout was multiplied by: one connection timeout per name."""
    conn = Connection(dict.fromkeys(CANDIDATES, "Connection timed out."))
    with pytest.raises(ansible.errors.AnsibleConnectionFailure):
        action(conn, install=False)._low_level_execute_command("echo FOUND")
    assert conn.tried == CANDIDATES

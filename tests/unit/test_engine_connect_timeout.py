"""Under Mitogen, the connection timeout bounds ssh's answer (ConnectTimeout, as Ansible's ssh
connection uses it) and Mitogen's whole start gets more on top (plugins/strategy/_connect_timeout.py).
Mitogen's own ssh options take the adjusted arguments."""

from __future__ import annotations

import types
from collections.abc import Callable
from typing import Any

import ansible_mitogen.connection
import ansible_mitogen.transport_config
import mitogen.parent
import mitogen.ssh
import plugin_code


def plugin(stem: str = "_connect_timeout"):
    return plugin_code.load("strategy", stem)


def test_ssh_gets_the_hosts_timeout_and_mitogens_start_more():
    mod = plugin()
    kwargs = {"hostname": "h", "connect_timeout": 10, "ssh_args": ["-o", "ConnectTimeout=99", "-F", "cfg"]}
    out = mod.adjust(kwargs)
    assert out["ssh_args"] == ["-o", "ConnectTimeout=10", "-o", "ConnectTimeout=99", "-F", "cfg"]
    assert out["connect_timeout"] == 10 + mod.START_SECONDS
    assert kwargs["connect_timeout"] == 10  # the caller's dict is left alone
    # A host's own ansible_timeout (the lab VMs' 60 s) is its ssh's.
    assert mod.adjust({"connect_timeout": "60", "ssh_args": None})["ssh_args"] == ["-o", "ConnectTimeout=60"]
    assert mod.adjust({"connect_timeout": None}) == {"connect_timeout": None}


def test_installed_it_adjusts_what_mitogens_ssh_connection_is_given():
    mod = plugin()
    table: dict[str, Callable[[Any], dict[str, Any]]] = {
        "ssh": lambda spec: {"method": "ssh", "kwargs": {"hostname": "h", "connect_timeout": 7, "ssh_args": ["-x"]}}
    }
    table["smart"] = table["ssh"]
    fake = types.SimpleNamespace(CONNECTION_METHOD=table)
    wrap = plugin("_host_keys").wrap_methods  # as the strategy puts it on
    wrap(fake, "provisioner_connect_timeout", mod.adjust)
    wrap(fake, "provisioner_connect_timeout", mod.adjust)  # once only
    stack = table["ssh"](None)
    assert stack["kwargs"]["ssh_args"] == ["-o", "ConnectTimeout=7", "-x"]
    assert stack["kwargs"]["connect_timeout"] == 7 + mod.START_SECONDS
    # Mitogen's ssh options take them as they are: the args go to ssh, the deadline to the start.
    options = mitogen.ssh.Options(max_message_size=1 << 20, **stack["kwargs"])
    assert options.ssh_args[:2] == ["-o", "ConnectTimeout=7"] and options.connect_timeout == 37
    # The real table holds both methods.
    assert {"ssh", "smart"} <= set(ansible_mitogen.connection.CONNECTION_METHOD)
    assert mitogen.parent.Options.connect_timeout == 30.0 == mod.START_SECONDS


def test_mitogens_ssh_compresses_only_when_the_host_asks():
    """Wheels and zip archives are compressed already: Mitogen's ssh leaves -o Compression yes out
    unless a host's mitogen_ssh_compression sets it (either way)."""
    mod = plugin("_compression")

    def original(spec: Any) -> dict[str, Any]:  # as ansible_mitogen's: the host var, else True
        asked = spec.mitogen_ssh_compression()
        return {"method": "ssh", "kwargs": {"hostname": "h", "compression": True if asked is None else asked, "ssh_args": []}}

    table: dict[str, Callable[[Any], dict[str, Any]]] = {"ssh": original, "smart": original}
    fake = types.SimpleNamespace(CONNECTION_METHOD=table)
    plugin("_host_keys").wrap_methods(fake, "provisioner_uncompressed", mod.uncompressed, with_spec=True)

    def spec(value):
        return types.SimpleNamespace(mitogen_ssh_compression=lambda: value)

    for value, compressed in ((None, False), (True, True), (False, False)):
        stack = table["smart"](spec(value))
        argv = mitogen.ssh.Options(max_message_size=1 << 20, **stack["kwargs"])
        assert argv.compression is compressed, value
    # The real spec answers the host var (None when unset).
    assert hasattr(ansible_mitogen.transport_config.PlayContextSpec, "mitogen_ssh_compression")

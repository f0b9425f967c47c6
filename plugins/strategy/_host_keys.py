"""Host key checking under Mitogen as `provisioner ... --accept-new-host-keys` asks for it.

Ansible's ssh connection takes the product's `-o StrictHostKeyChecking=accept-new` from
ANSIBLE_SSH_ARGS. Mitogen builds its own ssh command line and puts `-o StrictHostKeyChecking
yes` (its mode "enforce", Ansible's host_key_checking on) ahead of every ssh argument it is
given; ssh keeps the first value it reads, so the product's option was ignored and a server
never seen was refused. Mitogen's own mode "accept" does what accept-new does: it runs ssh
with `StrictHostKeyChecking ask` and answers "yes" to the prompt ssh shows for an unknown key,
while a key that differs from the recorded one fails before any prompt (ssh refuses it under
"ask" as under "yes"). With PROVISIONER_HOST_KEYS=accept-new, "enforce" becomes "accept";
"ignore" (host_key_checking off) stays what the user chose.

A check run changes nothing, on the hosts or on the control node: with
PROVISIONER_HOST_KEYS_SCRATCH=DIR, ssh reads and records keys in copies (in DIR) of the
known_hosts files it would use (`ssh -G` names them). A first-seen key is trusted for that
run only; a changed one is still refused, the copies holding what the originals hold.
"""

from __future__ import annotations

import hashlib
import os
import shutil
import subprocess
from collections.abc import Callable, Sequence
from typing import Any

MODE_ENV = "PROVISIONER_HOST_KEYS"
SCRATCH_ENV = "PROVISIONER_HOST_KEYS_SCRATCH"
ACCEPT_NEW = "accept-new"


def known_hosts_files(ssh_path: str, args: Sequence[str], host: str, port: Any, user: Any) -> list[str]:
    """The UserKnownHostsFile list ssh would use for HOST with ARGS (`ssh -G`), [] if unknown."""
    cmd = [ssh_path or "ssh", "-G", *args]
    if port:
        cmd += ["-p", str(port)]
    if user:
        cmd += ["-l", str(user)]
    try:
        out = subprocess.run([*cmd, host], capture_output=True, text=True, timeout=30, check=True).stdout
    except (OSError, subprocess.SubprocessError):
        return []
    for line in out.splitlines():
        key, _, value = line.partition(" ")
        if key.lower() == "userknownhostsfile":
            files = [os.path.expanduser(f) for f in value.split()]
            # A token ssh expands itself (%d, %u, ...) is not a path this code can copy.
            return [] if any("%" in f for f in files) else files
    return []


def scratch_copy(original: str, scratch: str) -> str:
    """SCRATCH's copy of known_hosts file ORIGINAL (empty if it does not exist), made once:
    every connection of the run reads the same copy, so a key ssh records there holds."""
    copy = os.path.join(scratch, hashlib.sha256(original.encode()).hexdigest()[:16] + ".known_hosts")
    if os.path.exists(copy):
        return copy
    os.makedirs(scratch, mode=0o700, exist_ok=True)
    partial = f"{copy}.{os.getpid()}"
    if os.path.isfile(original):
        shutil.copyfile(original, partial)
    else:
        open(partial, "w").close()
    try:
        os.link(partial, copy)  # fails if another worker made it first: theirs holds
    except FileExistsError:
        pass
    finally:
        os.unlink(partial)
    return copy


Lookup = Callable[[str, Sequence[str], str, Any, Any], list[str]]


def adjust(kwargs: dict[str, Any], mode: str, scratch: str, lookup: Lookup = known_hosts_files) -> dict[str, Any]:
    """Mitogen's ssh connection arguments (`_connect_ssh`'s kwargs) as MODE and SCRATCH ask.

    Raises RuntimeError when a check run cannot tell which known_hosts files to leave alone:
    better unreachable than a file of the user's changed by a check.
    """
    if mode != ACCEPT_NEW or kwargs.get("check_host_keys") != "enforce":
        return kwargs
    adjusted = dict(kwargs, check_host_keys="accept")
    if scratch:
        args = list(kwargs.get("ssh_args") or [])
        files = lookup(kwargs.get("ssh_path") or "ssh", args, kwargs["hostname"], kwargs.get("port"), kwargs.get("username"))
        if not files:
            raise RuntimeError(
                f"cannot tell which known_hosts files ssh uses for {kwargs['hostname']} (ssh -G): "
                "a check run does not record a first-seen key; record it first (ssh-keyscan) or run without --check"
            )
        copies = " ".join(scratch_copy(f, scratch) for f in files)
        # Ahead of every other argument: ssh keeps the first UserKnownHostsFile it reads.
        adjusted["ssh_args"] = ["-o", f"UserKnownHostsFile={copies}", *args]
    return adjusted


def wrap_methods(
    connection_module: Any, flag: str, change: Callable[..., dict[str, Any]], with_spec: bool = False
) -> None:
    """Wrap ansible_mitogen.connection's ssh connection methods so that CHANGE adjusts the
    arguments they give Mitogen's ssh connection (WITH_SPEC: CHANGE(kwargs, spec), the host's
    connection spec too); FLAG marks the wrapper, which is put on once."""
    table = connection_module.CONNECTION_METHOD
    for name in ("ssh", "smart"):
        original = table[name]
        if getattr(original, flag, False):
            continue

        def method(spec: Any, _original: Callable[[Any], dict[str, Any]] = original) -> dict[str, Any]:
            stack = _original(spec)
            stack["kwargs"] = change(stack["kwargs"], spec) if with_spec else change(stack["kwargs"])
            return stack

        setattr(method, flag, True)
        table[name] = method


def install(connection_module: Any, environ: dict[str, str] | os._Environ[str] = os.environ) -> None:
    """Wrap ansible_mitogen.connection's ssh connection methods (in this process, before the
    workers fork) when the run asks for first-seen keys to be accepted."""
    mode = environ.get(MODE_ENV, "")
    scratch = environ.get(SCRATCH_ENV, "")
    if mode != ACCEPT_NEW:
        return
    wrap_methods(connection_module, "provisioner_host_keys", lambda kwargs: adjust(kwargs, mode, scratch))

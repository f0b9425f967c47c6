"""SSH: this command's master sockets (one connection per host for every playbook it runs),
the options ssh gets, the connection timeout, and why a host could not be reached."""

from __future__ import annotations

import atexit
import os
import shutil
import subprocess
import tempfile
from collections.abc import Iterator
from contextlib import contextmanager
from pathlib import Path

from .. import paths
from ..errors import BadInput

# SSH connection reuse: one master connection per host for every playbook a command runs,
# kept this long after its last use, and closed (`ssh -O exit`) when the command ends.
CONTROL_PERSIST_SECONDS = 120
# A Unix socket's path holds at most 108 bytes (sun_path); ssh adds a 17-character suffix to
# the path while it sets the master up, and %C expands to 40 hex digits.
_SOCKET_PATH_MAX = 104 - 17 - 1 - 40

# Seconds a host may take to answer a connection (Ansible's timeout: ssh's ConnectTimeout, the
# connect deadline of Mitogen, which also gives each Python it tries no more): --connect-timeout.
# An inventory's ansible_timeout for a host wins (the lab VMs' 60 s under emulation).
DEFAULT_CONNECT_TIMEOUT = 10
_connect_timeout = DEFAULT_CONNECT_TIMEOUT


def set_connect_timeout(seconds: int) -> None:
    """The connection timeout of every run this command starts; a whole number of seconds from 1."""
    global _connect_timeout
    if seconds < 1:
        raise BadInput(
            f"--connect-timeout {seconds}: give a whole number of seconds, 1 or more (default {DEFAULT_CONNECT_TIMEOUT})"
        )
    _connect_timeout = seconds


def connect_timeout() -> int:
    return _connect_timeout


class _Multiplexer:
    """The private directory of this command's SSH master sockets, under the state directory
    (one per process, so one command's cleanup never closes another's connections)."""

    def __init__(self) -> None:
        self.path: Path | None = None

    def directory(self) -> Path:
        if self.path is None:
            base = paths.state_dir() / "ssh"
            if len(str(base)) + 12 > _SOCKET_PATH_MAX:
                # A state directory too deep for a socket path: a private one under /tmp instead.
                base = Path(tempfile.gettempdir()) / f"provisioner-ssh-{os.geteuid()}"
            base.mkdir(mode=0o700, parents=True, exist_ok=True)
            _prune_dead(base)
            self.path = Path(tempfile.mkdtemp(prefix=f"{os.getpid()}-", dir=base))
            atexit.register(self.close)
        return self.path

    def close(self) -> None:
        """End every master this command started, then remove its directory."""
        if self.path is None:
            return
        close_masters(self.path)
        shutil.rmtree(self.path, ignore_errors=True)
        self.path = None


def close_masters(directory: Path) -> None:
    for sock in directory.iterdir() if directory.is_dir() else ():
        if sock.is_dir():
            continue  # not a master: the caller removes the directory as a whole
        if sock.is_socket():
            # The host name is not needed: the socket is named by ControlPath.
            subprocess.run(
                ["ssh", "-o", f"ControlPath={sock}", "-O", "exit", "provisioner-master"],
                capture_output=True,
                timeout=30,
                check=False,
                stdin=subprocess.DEVNULL,
            )
        sock.unlink(missing_ok=True)


def _prune_dead(base: Path) -> None:
    """Directories left by a command that was killed before it could close its masters."""
    for d in base.iterdir():
        pid = d.name.split("-", 1)[0]
        if d.is_dir() and pid.isdigit() and not Path(f"/proc/{pid}").exists():
            close_masters(d)
            shutil.rmtree(d, ignore_errors=True)


_MUX = _Multiplexer()


def close_connections() -> None:
    """Close this command's SSH masters now (also done when the process exits)."""
    _MUX.close()


def _ssh_args(accept_new_host_keys: bool) -> str:
    strict = "accept-new" if accept_new_host_keys else "yes"
    # Options given first win in ssh: these hold whatever an inventory adds later (a lab
    # server's inventory says ControlMaster=no for the plain ssh command it also serves).
    return (
        f"-o StrictHostKeyChecking={strict} -o ControlMaster=auto -o ControlPersist={CONTROL_PERSIST_SECONDS}s"
        f" -o ControlPath={_MUX.directory()}/%C"
    )


@contextmanager
def shared_ssh_masters() -> Iterator[None]:
    """While active, testinfra's ssh commands (verify) go through this command's masters too:
    testinfra reads ssh_args from the Ansible config that ANSIBLE_CONFIG names, ahead of the
    inventory's options (ssh keeps the first value it is given)."""
    config = Path(tempfile.mkstemp(prefix="ansible-", suffix=".cfg", dir=_MUX.directory())[1])
    # configparser's interpolation reads %% as one %.
    config.write_text(f"[ssh_connection]\nssh_args = {_ssh_args(False).replace('%', '%%')}\n")
    before = os.environ.get("ANSIBLE_CONFIG")
    os.environ["ANSIBLE_CONFIG"] = str(config)
    try:
        yield
    finally:
        if before is None:
            os.environ.pop("ANSIBLE_CONFIG", None)
        else:
            os.environ["ANSIBLE_CONFIG"] = before
        config.unlink(missing_ok=True)


def _host_keys_env(accept_new_host_keys: bool, check: bool) -> dict[str, str]:
    """What the Mitogen strategy reads to accept a first-seen host key (plugins/strategy/_host_keys.py):
    its ssh command line holds StrictHostKeyChecking yes ahead of ANSIBLE_SSH_ARGS. A check run
    records such a key only in copies of the known_hosts files, in this command's private directory."""
    if not accept_new_host_keys:
        return {}
    env = {"PROVISIONER_HOST_KEYS": "accept-new"}
    if check:
        # Files beside the master sockets: removed with them when the command ends.
        env["PROVISIONER_HOST_KEYS_SCRATCH"] = str(_MUX.directory())
    return env


# Mitogen's words for both a changed and an unknown host key (it keeps ssh's own to itself).
_MITOGEN_HOST_KEY = "reported an unrecognized or mismatching host key"
# Mitogen answering ssh's prompts (as it does when it accepts first-seen keys): a key login refused.
_MITOGEN_PASSWORD = "SSH password was requested, but none specified"


def explain_unreachable(host: str, msg: str, accept_new_host_keys: bool = False) -> str:
    """One line that says why a host could not be reached and how to fix it.

    A key is called changed only when ssh said so, or when first-seen keys were accepted (under
    either strategy a key never recorded is then recorded, so a refusal means another key is)."""
    changed = (
        f"{host}: its SSH host key changed since it was recorded in known_hosts; if the server "
        f"was reinstalled, remove the old key (ssh-keygen -R ADDRESS) and run again"
    )
    unknown = (
        "its SSH host key is not in known_hosts; pass --accept-new-host-keys to trust a first-seen key, "
        "or add it yourself (ssh-keyscan ADDRESS >> known_hosts, after checking its fingerprint)"
    )
    if "REMOTE HOST IDENTIFICATION HAS CHANGED" in msg or ("Host key for" in msg and "has changed" in msg):
        return changed
    if _MITOGEN_HOST_KEY in msg:
        if accept_new_host_keys:
            return changed
        # Mitogen does not say which: name both, the first contact first.
        return (
            f"{host}: {unknown}; or, if it was recorded and the server was reinstalled since, "
            f"the key changed: remove the old one (ssh-keygen -R ADDRESS)"
        )
    if "Host key verification failed" in msg or "No ED25519 host key is known" in msg or "host key is known" in msg:
        return f"{host}: {unknown}"
    if "Permission denied" in msg or "Authentication failed" in msg or _MITOGEN_PASSWORD in msg:
        return (
            f"{host}: SSH login was refused; check ansible_user and ansible_ssh_private_key_file "
            f"in the inventory and that the key is authorized on the host"
        )
    if "Could not resolve hostname" in msg:
        return f"{host}: its name does not resolve; set ansible_host to its address in the inventory"
    lines = [line.strip() for line in msg.strip().splitlines() if line.strip()]
    # Mitogen's "EOF on stream; last 100 lines received:" is followed by what ssh said: that says why.
    said = lines[-1] if len(lines) > 1 and lines[0].endswith("received:") else (lines[0] if lines else "no answer")
    if "timed out" in said:
        return (
            f"{host}: unreachable ({said if said.startswith('ssh:') else 'ssh: ' + said}); check that it is up and that ansible_host/port are right, "
            f"or give a slow host more time with --connect-timeout SECONDS (now {connect_timeout()})"
        )
    return f"{host}: unreachable ({said}); check that it is up and that ansible_host/port are right"

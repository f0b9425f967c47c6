"""The only module that talks to ansible-runner.

It validates what can be validated before any host is touched, runs a playbook,
turns ansible-runner's event stream into progress callbacks and per-host results,
and turns connection failures into one-line errors that name the fix.
"""

from __future__ import annotations

import atexit
import os
import re
import shutil
import signal
import subprocess
import sys
import tempfile
import time
from collections.abc import Iterator, Sequence
from contextlib import contextmanager, suppress
from dataclasses import dataclass
from pathlib import Path
from typing import Any

import yaml

from . import paths
from .errors import BadInput, Interrupted, ProvisionerError
from .runs import WARNING_PREFIX, Change, Diff, HostResult, ProgressCallback, RunResult
from .system import locked

# Keep this many runs' artifacts (events, stdout) in the state directory.
KEEP_ARTIFACTS = 20

# A play-level variable that marks a play as the input check: read-only (the plan, every
# role's preflight), so any failure in it is bad input refused before a host was changed.
INPUT_CHECK_VAR = "provisioner_input_check"

# Tags every playbook accepts without a role declaring them.
_BUILTIN_TAGS = {"all", "always", "never", "tagged", "untagged"}

# SSH connection reuse: one master connection per host for every playbook a command runs,
# kept this long after its last use, and closed (`ssh -O exit`) when the command ends.
CONTROL_PERSIST_SECONDS = 120
# A Unix socket's path holds at most 108 bytes (sun_path); ssh adds a 17-character suffix to
# the path while it sets the master up, and %C expands to 40 hex digits.
_SOCKET_PATH_MAX = 104 - 17 - 1 - 40

# Forks: one per host, bounded by the control node's memory. Each fork is a copy of
# ansible-playbook (AWX sizes its capacity the same way: 100 MiB per fork once 2 GiB are kept
# back for the rest of the machine); PROVISIONER_FORKS overrides.
FORK_MEMORY_BYTES = 100 * 2**20
RESERVED_MEMORY_BYTES = 2 * 2**30
FORKS_ENV = "PROVISIONER_FORKS"
# The execution strategy (see _strategy_env), PROVISIONER_STRATEGY=linear|mitogen for every
# playbook. Unset: Mitogen's for the playbooks of many module tasks (a no-op re-run of site.yml
# takes half the time), Ansible's own for the rest: one task or a few per host, where Mitogen
# gains nothing, and `script` tasks, whose stderr Mitogen does not hand back apart (the status
# script's one-line reason became "Shared connection to HOST closed").
STRATEGY_ENV = "PROVISIONER_STRATEGY"
DEFAULT_STRATEGY = "mitogen"
MITOGEN_PLAYBOOKS = frozenset({"site.yml", "undo.yml"})

# A run's event files (ansible-runner's job_events, a few KB each): about 2.5 per task and host,
# 15 MB for site.yml on four hosts. Above this many hosts only the events that tell something
# are written (failures, unreachable hosts, changes); stdout keeps the whole run's log either way.
KEEP_ALL_EVENTS_HOSTS = 50
_ROUTINE_EVENTS = frozenset(
    {"runner_on_start", "runner_on_ok", "runner_on_skipped", "runner_item_on_ok", "runner_item_on_skipped", "verbose"}
)

# Rolling runs: the extra vars site.yml's role plays read as `serial` and `max_fail_percentage`
# (unset: every host at once, no threshold).
SERIAL_VAR = "provisioner_serial"
MAX_FAIL_VAR = "provisioner_max_fail_percentage"
_BATCH_RE = re.compile(r"^\s*(\d+)\s*(%?)\s*$")


# ---------------------------------------------------------------- validation


def resolve_inventory(inventory: str | Path | None) -> Path:
    """The inventory path to use; None means this machine."""
    path = Path(inventory) if inventory else paths.LOCAL_INVENTORY
    if not path.exists():
        raise BadInput(
            f"inventory {path} does not exist: pass an existing file or directory with -i, or omit -i to provision this machine"
        )
    return path.resolve()


def known_tags() -> set[str]:
    """Every tag declared in the playbooks and roles shipped with provisioner."""
    tags = set(_BUILTIN_TAGS)
    files = list(paths.PLAYBOOKS.glob("*.yml")) + list(paths.ROLES.glob("*/tasks/*.yml"))
    for f in files:
        tags |= _tags_in(yaml.safe_load(f.read_text()))
    return tags


def _tags_in(node: Any) -> set[str]:
    found: set[str] = set()
    if isinstance(node, dict):
        value = node.get("tags")
        if isinstance(value, str):
            found.add(value)
        elif isinstance(value, list):
            found |= {t for t in value if isinstance(t, str)}
        for v in node.values():
            found |= _tags_in(v)
    elif isinstance(node, list):
        for v in node:
            found |= _tags_in(v)
    return found


def check_tags(tags: Sequence[str], skip_tags: Sequence[str]) -> None:
    if not tags and not skip_tags:
        return  # nothing to check: reading every playbook and task file costs a quarter second a run
    known = known_tags()
    unknown = sorted({t for t in (*tags, *skip_tags) if t not in known})
    if unknown:
        raise BadInput(f"unknown tag(s) {', '.join(unknown)}: use one of {', '.join(sorted(known - _BUILTIN_TAGS))}")


def inventory_hosts(inventory: Path) -> dict[str, Any]:
    """Parse the inventory with Ansible itself; a malformed one is refused with Ansible's reason."""
    from ansible_runner.interface import get_inventory

    _check_yaml(inventory)
    ensure_tools_on_path()
    out, err = get_inventory(
        action="list",
        inventories=[str(inventory)],
        response_format="json",
        envvars=_inventory_env(),
        quiet=True,
    )
    if not isinstance(out, dict):
        raise BadInput(f"inventory {inventory} is not valid: {_first_error(str(err) or str(out))}")
    hosts = out.get("_meta", {}).get("hostvars", {})
    for group in out.values():
        if isinstance(group, dict):
            hosts.update({h: hosts.get(h, {}) for h in group.get("hosts", [])})
    if not hosts:
        raise BadInput(f"inventory {inventory} defines no hosts: add at least one host to it")
    return hosts


def _check_yaml(inventory: Path) -> None:
    """A YAML inventory that is not YAML: say where, as PyYAML sees it."""
    files = [inventory] if inventory.is_file() else sorted(inventory.rglob("*.y*ml"))
    for f in files:
        if f.suffix not in (".yml", ".yaml"):
            continue
        try:
            yaml.safe_load(f.read_text())
        except yaml.YAMLError as exc:
            mark = getattr(exc, "problem_mark", None)
            where = f" line {mark.line + 1} column {mark.column + 1}" if mark else ""
            problem = getattr(exc, "problem", None) or str(exc).splitlines()[0]
            raise BadInput(f"inventory {f} is not valid YAML at{where}: {problem}; fix the file and run again") from exc


def _first_error(text: str) -> str:
    lines = [ln.strip() for ln in text.splitlines() if ln.strip()]
    for ln in lines:
        if "Failed to parse inventory with" in ln:
            return ln.split(":", 2)[-1].strip()
    for ln in lines:
        if "ERROR" in ln or "Error" in ln or "error" in ln:
            return re.sub(r"^\[?ERROR\]?:?!?\s*", "", ln)
    return lines[0] if lines else "unknown error"


def _inventory_env() -> dict[str, str]:
    return {
        # An inventory Ansible cannot parse is an error, not a warning and an empty run.
        "ANSIBLE_INVENTORY_UNPARSED_FAILED": "True",
        "ANSIBLE_INVENTORY_ANY_UNPARSED_IS_FAILED": "True",
        "ANSIBLE_INVENTORY_ENABLED": "host_list,yaml,ini,auto,toml",
        "ANSIBLE_NOCOLOR": "True",
    }


# ---------------------------------------------------------------- running


def ensure_tools_on_path() -> None:
    """ansible-runner shells out to ansible-playbook and ansible-inventory: put the
    interpreter's bin first on PATH, and say so plainly when they are not there."""
    bindir = str(Path(sys.executable).parent)
    parts = os.environ.get("PATH", "").split(os.pathsep)
    if bindir not in parts:
        os.environ["PATH"] = os.pathsep.join([bindir, *parts])
    missing = [tool for tool in ("ansible-playbook", "ansible-inventory") if shutil.which(tool) is None]
    if missing:
        raise ProvisionerError(
            f"{' and '.join(missing)} not found beside {sys.executable}: reinstall provisioner with its "
            "dependencies (bash install.sh, or pipx install .)"
        )


def forks_for(hosts: int, available_memory: int | None = None, override: str | None = None) -> int:
    """Parallel hosts for a run: every host at once, as far as the control node's memory
    allows; `override` (PROVISIONER_FORKS) wins, a positive whole number or refused."""
    if override is not None and override.strip():
        if not override.strip().isdigit() or int(override) < 1:
            raise BadInput(f"{FORKS_ENV}={override!r} is not a positive whole number: set it to 1 or more, or unset it")
        return int(override)
    if available_memory is None:
        import psutil

        available_memory = int(psutil.virtual_memory().available)
    bound = max(1, (available_memory - RESERVED_MEMORY_BYTES) // FORK_MEMORY_BYTES)
    return max(1, min(hosts, bound))


@dataclass(frozen=True)
class Batch:
    """A rolling run's batch size as given: a number of hosts, or a share of the fleet."""

    value: int
    percent: bool

    def __str__(self) -> str:
        return f"{self.value}{'%' if self.percent else ''}"

    def hosts(self, fleet: int) -> int:
        """Hosts per batch in a fleet of `fleet` (a share rounds down, as Ansible's serial does,
        and is at least one host); refused when it is none or more than the fleet."""
        if self.value == 0:
            raise BadInput(f"--batch {self}: a batch of no hosts never ends; give 1 or more hosts, or a share like 25%")
        if self.percent:
            if self.value > 100:
                raise BadInput(f"--batch {self}: more than the whole fleet; give a share from 1% to 100%")
            return max(1, fleet * self.value // 100)
        if self.value > fleet:
            raise BadInput(
                f"--batch {self}: more hosts than the {fleet} this run reaches; give 1 to {fleet}, or a share like 25%"
            )
        return self.value


def parse_batch(value: str) -> Batch:
    """`--batch N` (hosts) or `--batch P%` (a share of the fleet); anything else is refused."""
    m = _BATCH_RE.match(value)
    if not m:
        raise BadInput(f"--batch {value!r} is not a number of hosts or a share: give e.g. --batch 10 or --batch 25%")
    return Batch(int(m[1]), bool(m[2]))


def parse_max_fail(value: str) -> int:
    """`--max-fail P%`: the share of a batch's hosts that may fail before the roll stops (0-100)."""
    m = _BATCH_RE.match(value)
    if not m or int(m[1]) > 100:
        raise BadInput(
            f"--max-fail {value!r} is not a share from 0% to 100%: give e.g. --max-fail 10% (0%: stop at the first failure)"
        )
    return int(m[1])


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


def _patterns(limit: str) -> list[str]:
    """The parts of an Ansible host pattern (a,b or a:b), as Ansible splits it."""
    from ansible.inventory.manager import split_host_pattern

    return [p for p in split_host_pattern(limit) if p]


def check_limit(inventory: Path, limit: str | None) -> None:
    """Refuse --limit here, before any host is contacted, when it or one of its parts matches no
    host of the inventory (Ansible would warn, drop that part and run on the rest, or stop with a
    sentence of its own): the one line names what the inventory has."""
    if not limit:
        return
    from ansible import constants
    from ansible.inventory.manager import InventoryManager
    from ansible.parsing.dataloader import DataLoader

    manager = InventoryManager(loader=DataLoader(), sources=[str(inventory)])
    said, constants.HOST_PATTERN_MISMATCH = constants.HOST_PATTERN_MISMATCH, "ignore"  # the refusal says it, once
    try:
        # An exclusion (!x) that excludes nothing harms nothing; @file is read by Ansible.
        missing = [p for p in _patterns(limit) if p[0] not in "!@" and not manager.get_hosts(pattern=p.lstrip("&"))]
        manager.subset(limit)
        if not missing and manager.get_hosts("all"):
            return
    finally:
        constants.HOST_PATTERN_MISMATCH = said
    groups = sorted(g for g in manager.groups if g not in ("all", "ungrouped"))
    hosts = sorted(manager.hosts)
    names = [*(f"group {g}" for g in groups[:10]), *hosts[:10]]
    more = len(groups[10:]) + len(hosts[10:])
    have = ", ".join(names) + (f" and {more} more" if more else "")
    what = f"{', '.join(missing)} {'matches' if len(missing) == 1 else 'match'} no host" if missing else "matches no host"
    raise BadInput(f"--limit {limit}: {what} of {inventory}; name hosts or groups it has: {have}")


def fleet_hosts(inventory: Path, limit: str | None) -> list[str]:
    """The hosts a run reaches: the inventory's, narrowed by --limit as Ansible reads the pattern."""
    from ansible.inventory.manager import InventoryManager
    from ansible.parsing.dataloader import DataLoader

    manager = InventoryManager(loader=DataLoader(), sources=[str(inventory)])
    if limit:
        manager.subset(limit)
    return [h.name for h in manager.get_hosts("all")]


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


# ---------------------------------------------------------------- interruption

# SIGINT or SIGTERM to the command (a terminal's Ctrl-C, a supervisor, a CI cancel, kill -INT PID)
# stops its run as a whole. ansible-runner starts ansible-playbook in a session of its own (on a
# pty), so neither a terminal's Ctrl-C nor a signal to this process alone reaches it: the handler
# sends SIGINT to the run's process group (ansible-playbook, its workers, their ssh), waits for
# ansible-playbook to end as it does on Ctrl-C, and kills the group after INTERRUPT_GRACE_SECONDS
# or at a second signal. Processes of the run that left the group (an ssh master, Mitogen's
# children) are found by RUN_MARKER_ENV in their environment and ended too.
INTERRUPT_SIGNALS = (signal.SIGINT, signal.SIGTERM)
INTERRUPT_GRACE_SECONDS = 20.0
RUN_MARKER_ENV = "PROVISIONER_RUN"


class _Interruption:
    """The signal that stopped this command, and what the handler does with it."""

    def __init__(self) -> None:
        self.signum = 0
        self.count = 0
        self.at = 0.0
        self.forwarded = False
        self.running = False  # inside ansible_runner.run: forward, never raise

    def reset(self) -> None:
        self.__init__()  # type: ignore[misc]

    def handle(self, signum: int, frame: Any = None) -> None:
        self.count += 1
        if not self.signum:
            self.signum, self.at = signum, time.monotonic()
        if not self.running:
            raise Interrupted(self.signum)
        # A second signal: no more waiting.
        self.forwarded = forward_to_runs(signal.SIGINT if self.count == 1 else signal.SIGKILL) or self.forwarded

    def cancel(self) -> bool:
        """ansible-runner's cancel_callback (polled while the run goes on): True kills the run's group."""
        if not self.signum:
            return False
        if not self.forwarded:  # the signal came while ansible-playbook was being started
            self.forwarded = forward_to_runs(signal.SIGINT)
        return time.monotonic() - self.at > INTERRUPT_GRACE_SECONDS

    def check(self) -> None:
        """No new run once the command was interrupted."""
        if self.signum:
            raise Interrupted(self.signum)


_INTERRUPT = _Interruption()


def interrupted() -> int:
    """The signal that interrupted this command (0: none)."""
    return _INTERRUPT.signum


@contextmanager
def interruptible() -> Iterator[None]:
    """While active (the whole command), SIGINT and SIGTERM stop the command's run as a whole
    (see INTERRUPT_SIGNALS) instead of killing this process alone; outside a run they raise
    Interrupted. Only the main thread can set signal handlers: elsewhere this does nothing."""
    import threading

    if threading.current_thread() is not threading.main_thread():
        yield
        return
    _INTERRUPT.reset()
    before = {s: signal.signal(s, _INTERRUPT.handle) for s in INTERRUPT_SIGNALS}
    try:
        yield
    finally:
        for s, handler in before.items():
            signal.signal(s, handler)


def _run_marker(ident: str) -> str:
    return f"{os.getpid()}:{ident}"


def _marked(proc: Any, prefix: str) -> bool:
    import psutil

    try:
        return str(proc.environ().get(RUN_MARKER_ENV, "")).startswith(prefix)
    except (psutil.Error, OSError):
        return False


def forward_to_runs(signum: int) -> bool:
    """Send `signum` to the process group of each run this process started (a child of it
    marked with RUN_MARKER_ENV, the leader of its own session); True when there was one."""
    import psutil

    sent = False
    for child in psutil.Process().children():
        if _marked(child, f"{os.getpid()}:"):
            try:
                os.killpg(os.getpgid(child.pid), signum)
                sent = True
            except ProcessLookupError:
                pass
    return sent


def end_run_processes(prefix: str | None = None, grace: float = 5.0) -> int:
    """End every process still carrying this command's run marker (SIGTERM, then SIGKILL after
    `grace` seconds) and wait for them; returns how many there were."""
    import psutil

    prefix = prefix or f"{os.getpid()}:"
    me = os.getpid()
    left = [p for p in psutil.process_iter() if p.pid != me and _marked(p, prefix)]
    for p in left:
        with suppress(psutil.Error):
            p.terminate()
    _, alive = psutil.wait_procs(left, timeout=grace)
    for p in alive:
        with suppress(psutil.Error):
            p.kill()
    psutil.wait_procs(alive, timeout=grace)
    return len(left)


def _ssh_args(accept_new_host_keys: bool) -> str:
    strict = "accept-new" if accept_new_host_keys else "yes"
    # Options given first win in ssh: these hold whatever an inventory adds later (a lab
    # server's inventory says ControlMaster=no for the plain ssh command it also serves).
    return (
        f"-o StrictHostKeyChecking={strict} -o ControlMaster=auto -o ControlPersist={CONTROL_PERSIST_SECONDS}s"
        f" -o ControlPath={_MUX.directory()}/%C"
    )


def _strategy_env(choice: str | None) -> dict[str, str]:
    """The environment of a strategy: "mitogen" runs Mitogen's linear strategy, one Python
    interpreter kept per host instead of a module sent over SSH for every task; "linear" (or
    None) is Ansible's own, also the way out when Mitogen misbehaves on a host."""
    if not choice or choice == "linear":
        return {}
    if choice != "mitogen":
        raise BadInput(f"{STRATEGY_ENV}={choice!r} is not a strategy provisioner knows: use linear or mitogen")
    import importlib.util

    spec = importlib.util.find_spec("ansible_mitogen")
    if spec is None or not spec.submodule_search_locations:
        raise BadInput(
            f"{STRATEGY_ENV}=mitogen needs the mitogen package beside provisioner: pip install mitogen "
            f"(a dependency of provisioner: reinstall it), or set {STRATEGY_ENV}=linear"
        )
    # Mitogen's linear strategy with its CPU pinning switched off (plugins/strategy says why).
    return {
        "ANSIBLE_STRATEGY_PLUGINS": str(paths.PLUGINS / "strategy"),
        "ANSIBLE_STRATEGY": "provisioner_mitogen_linear",
        # Jinja's compiled code kept for the next run (plugins/strategy/_template_cache.py).
        "PROVISIONER_TEMPLATE_CACHE_DIR": str(paths.cache_dir() / "jinja"),
    }


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


def default_strategy(playbook: str) -> str:
    """The strategy a playbook runs with when PROVISIONER_STRATEGY is unset (see MITOGEN_PLAYBOOKS)."""
    return DEFAULT_STRATEGY if playbook in MITOGEN_PLAYBOOKS else "linear"


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


def _run_env(accept_new_host_keys: bool, playbook: str = "", check: bool = False) -> dict[str, str]:
    return {
        **_inventory_env(),
        "ANSIBLE_ROLES_PATH": str(paths.ROLES),
        # The roles' modules and plugins, laid out as in the provisioner.ml collection.
        "ANSIBLE_LIBRARY": str(paths.PLUGINS / "modules"),
        "ANSIBLE_MODULE_UTILS": str(paths.PLUGINS / "module_utils"),
        "ANSIBLE_ACTION_PLUGINS": str(paths.PLUGINS / "action"),
        "ANSIBLE_FILTER_PLUGINS": str(paths.PLUGINS / "filter"),
        "ANSIBLE_HOST_KEY_CHECKING": "True",
        "ANSIBLE_SSH_ARGS": _ssh_args(accept_new_host_keys),
        "ANSIBLE_PIPELINING": "True",
        "ANSIBLE_RETRY_FILES_ENABLED": "False",
        "ANSIBLE_FORCE_COLOR": "False",
        "ANSIBLE_NOCOLOR": "True",
        "ANSIBLE_DEPRECATION_WARNINGS": "False",
        "ANSIBLE_LOCALHOST_WARNING": "False",
        "ANSIBLE_PYTHON_INTERPRETER": "auto_silent",
        **_strategy_env(os.environ.get(STRATEGY_ENV) or default_strategy(playbook)),
        **_host_keys_env(accept_new_host_keys, check),
    }


def run_playbook(
    playbook: str,
    inventory: Path,
    *,
    limit: str | None = None,
    tags: Sequence[str] = (),
    skip_tags: Sequence[str] = (),
    check: bool = False,
    extravars: dict[str, Any] | None = None,
    verbosity: int = 0,
    accept_new_host_keys: bool = False,
    on_progress: ProgressCallback | None = None,
    forks: int | None = None,
    batch: Batch | None = None,
    max_fail: int | None = None,
) -> RunResult:
    """Run playbooks/<playbook> and return per-host results; raise BadInput for bad input.
    `forks` defaults to forks_for(the inventory's hosts, or a batch's). `batch` and `max_fail`
    make a rolling run (site.yml's role plays read them as serial and max_fail_percentage):
    a batch of no hosts or of more than the run reaches is refused here, before any host is touched."""
    import ansible_runner

    check_tags(tags, skip_tags)
    hostvars = inventory_hosts(inventory)  # refuse a malformed inventory before any host is touched
    check_limit(inventory, limit)
    parallel = len(hostvars)
    extravars = dict(extravars or {})
    rolling: dict[str, int] = {}
    if batch is not None:
        fleet = fleet_hosts(inventory, limit)
        parallel = rolling["hosts_per_batch"] = batch.hosts(len(fleet))
        rolling["fleet"] = len(fleet)
        extravars[SERIAL_VAR] = parallel
    if max_fail is not None:
        if batch is None:
            raise BadInput(f"--max-fail {max_fail}% stops a rolling run: give --batch N or --batch P% with it")
        rolling["max_fail_percentage"] = extravars[MAX_FAIL_VAR] = max_fail
    if forks is None:
        forks = forks_for(parallel, override=os.environ.get(FORKS_ENV))
    book = paths.PLAYBOOKS / playbook
    if not book.exists():
        raise ProvisionerError(f"playbook {book} is missing: reinstall provisioner")

    ensure_tools_on_path()
    runs = paths.state_dir() / "runs"
    runs.mkdir(parents=True, exist_ok=True)
    # ansible-runner writes a run's cmdline, extra vars and env into its private data
    # dir and reads them back next time: every run gets a fresh one, or a --check or a
    # -e from an earlier run would silently apply to this one.
    private = Path(tempfile.mkdtemp(prefix="run-", dir=runs))
    ident = time.strftime("%Y%m%dT%H%M%S") + f"-{os.getpid()}-{playbook.removesuffix('.yml')}"
    collector = _EventCollector(
        on_progress,
        input_check_plays(book),
        keep_routine=rolling.get("fleet", len(hostvars)) <= KEEP_ALL_EVENTS_HOSTS,
        accept_new_host_keys=accept_new_host_keys,
    )
    cmdline = " ".join(["--check --diff" if check else "", *(["-" + "v" * verbosity] if verbosity else [])])
    started = time.monotonic()
    _INTERRUPT.check()
    _INTERRUPT.running = True
    try:
        runner = ansible_runner.run(
            private_data_dir=str(private),
            artifact_dir=str(runs / "artifacts"),
            ident=ident,
            project_dir=str(paths.PLAYBOOKS),
            playbook=str(book),
            inventory=str(inventory),
            limit=limit,
            tags=",".join(tags) or None,
            skip_tags=",".join(skip_tags) or None,
            extravars=extravars,
            cmdline=cmdline.strip() or None,
            envvars={
                **_run_env(accept_new_host_keys, playbook, check),
                # Every process of the run inherits it: how an interruption finds them all.
                RUN_MARKER_ENV: _run_marker(ident),
                # Ansible's connection timeout (ssh's ConnectTimeout, Mitogen's connect deadline);
                # an inventory's ansible_timeout wins over it.
                "ANSIBLE_TIMEOUT": str(connect_timeout()),
            },
            forks=forks,
            event_handler=collector.handle,
            cancel_callback=_INTERRUPT.cancel,
            quiet=True,
            # Rotated below, not by ansible-runner: its rotation races with another run's
            # (two provisioner commands at once), deleting a directory the other still writes.
            rotate_artifacts=0,
            timeout=None,
        )
    finally:
        _INTERRUPT.running = False
        if _INTERRUPT.signum:
            end_run_processes()  # what left the run's process group, and what outlived the kill
        shutil.rmtree(private, ignore_errors=True)
        rotate_artifacts(runs / "artifacts", keep=KEEP_ARTIFACTS)
    seconds = time.monotonic() - started
    artifact_dir = Path(runner.config.artifact_dir)
    if _INTERRUPT.signum and not collector.hosts:
        raise Interrupted(_INTERRUPT.signum)
    if runner.rc != 0 and not collector.hosts:
        # ansible-playbook stopped before reaching any host: bad input.
        stdout = runner.stdout.read() if runner.stdout else ""
        raise BadInput(f"{_first_error(stdout)} (log: {artifact_dir / 'stdout'})")
    collector.mark_not_reached()
    return RunResult(
        playbook=playbook,
        check=check,
        rc=runner.rc,
        hosts=collector.hosts,
        batch=rolling,
        facts=collector.facts,
        changes=collector.changes,
        artifact_dir=artifact_dir,
        seconds=seconds,
        hostvars=hostvars,
        interrupted=_INTERRUPT.signum,
    )


def rotate_artifacts(artifacts: Path, keep: int) -> None:
    """Keep the newest `keep` run directories; one run at a time prunes (a file lock), and a
    directory that vanishes meanwhile is not an error."""
    if not artifacts.is_dir():
        return

    def age(p: Path) -> float:
        try:
            return p.stat().st_mtime
        except FileNotFoundError:
            return 0.0

    with locked(artifacts / ".rotate.lock"):
        runs = sorted((p for p in artifacts.iterdir() if p.is_dir()), key=age, reverse=True)
        for old in runs[keep:]:
            shutil.rmtree(old, ignore_errors=True)


def input_check_plays(book: Path) -> frozenset[int]:
    """Positions (0-based, in run order) of the plays of a playbook that set INPUT_CHECK_VAR."""
    marked: list[bool] = []

    def walk(path: Path) -> None:
        for play in yaml.safe_load(path.read_text()) or []:
            imported = play.get("import_playbook") or play.get("ansible.builtin.import_playbook")
            if imported:
                walk(path.parent / imported)
            else:
                marked.append(bool((play.get("vars") or {}).get(INPUT_CHECK_VAR)))

    walk(book)
    return frozenset(i for i, m in enumerate(marked) if m)


class _EventCollector:
    """Folds ansible-runner events into per-host counters, facts, diffs and errors."""

    def __init__(
        self,
        on_progress: ProgressCallback | None,
        input_plays: frozenset[int] = frozenset(),
        keep_routine: bool = True,
        accept_new_host_keys: bool = False,
    ):
        self.on_progress = on_progress
        self.accept_new_host_keys = accept_new_host_keys
        self.input_plays = input_plays
        self.keep_routine = keep_routine  # write every event to the artifacts, not only what tells something
        self.plays: dict[str, int] = {}  # play uuid -> position in the run
        self.hosts: dict[str, HostResult] = {}
        self.facts: dict[str, dict[str, Any]] = {}
        self.changes: list[Change] = []
        self.reached: dict[str, int] = {}  # host -> the furthest play it ran a task in

    def mark_not_reached(self) -> None:
        """Hosts a stopped rolling run never got to: neither failed nor unreachable, yet short
        of the furthest play another host ran (their batch came after the roll stopped)."""
        furthest = max(self.reached.values(), default=-1)
        for name, host in self.hosts.items():
            if not host.failed and not host.unreachable and self.reached.get(name, -1) < furthest:
                host.not_reached = True

    def _host(self, name: str) -> HostResult:
        if name not in self.hosts:
            self.hosts[name] = HostResult(host=name)
        return self.hosts[name]

    def handle(self, event: dict[str, Any]) -> bool:
        """Fold one event in; True when ansible-runner should write it to the artifacts."""
        self._fold(event)
        if self.keep_routine or event.get("event") not in _ROUTINE_EVENTS:
            return True
        return bool(((event.get("event_data") or {}).get("res") or {}).get("changed"))

    def _fold(self, event: dict[str, Any]) -> None:
        kind = event.get("event", "")
        data = event.get("event_data", {}) or {}
        if kind == "playbook_on_play_start":
            # A play run in batches (serial) starts again under "<uuid>_<n>": the same play.
            self.plays.setdefault(_play_id(data), len(self.plays))
        host_name = data.get("host")
        if not host_name or not kind.startswith("runner_"):
            return
        host = self._host(host_name)
        task = data.get("task", "")
        res = data.get("res", {}) or {}
        if kind == "runner_on_start":
            host.task = task
            position = self.plays.get(_play_id(data), -1)
            self.reached[host_name] = max(self.reached.get(host_name, -1), position)
        elif kind == "runner_on_ok":
            self._ok(host, task, res)
            self._warning(host, data, res)
        elif kind == "runner_item_on_ok":
            self._warning(host, data, res)
        elif kind == "runner_on_failed":
            if data.get("ignore_errors"):
                host.ok += 1
            else:
                host.failed += 1
                if self._is_input_check(data):
                    host.refused += 1
                host.errors.append(f"{task}: {_failure_message(res)}")
        elif kind == "runner_on_unreachable":
            host.unreachable += 1
            host.errors.append(explain_unreachable(host_name, res.get("msg", ""), self.accept_new_host_keys))
        elif kind == "runner_on_skipped":
            host.skipped += 1
        elif kind == "runner_item_on_failed":
            return
        if self.on_progress:
            self.on_progress(host)

    def _ok(self, host: HostResult, task: str, res: dict[str, Any]) -> None:
        if res.get("changed"):
            host.changed += 1
        else:
            host.ok += 1
        if res.get("ansible_facts"):
            self.facts.setdefault(host.host, {}).update(res["ansible_facts"])
        if res.get("changed"):
            self.changes.append(Change(host.host, task, diffs_of(res.get("diff"))))

    @staticmethod
    def _warning(host: HostResult, data: dict[str, Any], res: dict[str, Any]) -> None:
        """A role's warning: a debug message with WARNING_PREFIX (a loop's come one per item)."""
        action = str(data.get("resolved_action") or data.get("task_action") or "")
        msg = res.get("msg")
        if action.endswith("debug") and isinstance(msg, str) and msg.startswith(WARNING_PREFIX):
            host.warnings.append(msg[len(WARNING_PREFIX) :].strip())

    def _is_input_check(self, data: dict[str, Any]) -> bool:
        """Bad input: a failure in a play marked as the input check, or a role's argument spec refusing an option."""
        validation = str(data.get("resolved_action") or data.get("task_action") or "").endswith("validate_argument_spec")
        return validation or self.plays.get(_play_id(data)) in self.input_plays


def _play_id(data: dict[str, Any]) -> str:
    return str(data.get("play_uuid") or data.get("uuid") or "").split("_", 1)[0]


def diffs_of(raw: Any) -> list[Diff]:
    """Ansible's diff results (a dict or a list of them) as before/after text."""
    out = []
    for d in raw if isinstance(raw, list) else [raw] if raw else []:
        if not isinstance(d, dict):
            continue
        if "prepared" in d:
            out.append(Diff(text=str(d["prepared"]).rstrip()))
            continue
        before, after = d.get("before", ""), d.get("after", "")
        if isinstance(before, dict) or isinstance(after, dict):
            b, a = before or {}, after or {}
            keys = sorted(k for k in set(b) | set(a) if b.get(k) != a.get(k))
            before = "".join(f"{k}: {b.get(k)!r}\n" for k in keys)
            after = "".join(f"{k}: {a.get(k)!r}\n" for k in keys)
        out.append(Diff(str(before), str(after), str(d.get("before_header", "before")), str(d.get("after_header", "after"))))
    return out


def _failure_message(res: dict[str, Any]) -> str:
    msg = str(res.get("msg") or "").strip()
    detail = str(res.get("stderr") or "").strip().splitlines()
    if detail and detail[-1] not in msg:
        msg = f"{msg}: {detail[-1]}" if msg else detail[-1]
    items = [r for r in res.get("results") or [] if isinstance(r, dict) and r.get("failed")]
    if items:
        # A loop says only "One or more items failed": name each failed item and its reason.
        reasons = "; ".join(f"{_item_label(r)}: {_failure_message(r)}" for r in items)
        msg = f"{msg}: {reasons}" if msg else reasons
    if res.get("argument_errors"):  # a role's argument spec refused an option: name it
        msg = "invalid role options: " + "; ".join(str(e) for e in res["argument_errors"])
    return msg.splitlines()[0] if msg else "failed"


def _item_label(res: dict[str, Any]) -> str:
    """How a loop item shows itself: its loop_control label, else the item."""
    label = res.get("_ansible_item_label", res.get("item", "?"))
    return str(label)


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

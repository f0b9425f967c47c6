"""One playbook run through ansible-runner: its environment, its checks before any host is
touched, the run itself, and its artifacts kept and rotated."""

from __future__ import annotations

import os
import shutil
import tempfile
import time
from collections.abc import Sequence
from pathlib import Path
from typing import Any

from .. import paths
from ..errors import BadInput, Interrupted, ProvisionerError
from ..runs import ProgressCallback, RunResult
from ..system import locked
from .batches import MAX_FAIL_VAR, SERIAL_VAR, Batch
from .events import KEEP_ALL_EVENTS_HOSTS, _EventCollector, input_check_plays
from .forks import FORKS_ENV, forks_for
from .interrupt import _INTERRUPT, RUN_MARKER_ENV, _run_marker, end_run_processes
from .inventory import _first_error, _inventory_env, check_limit, check_tags, ensure_tools_on_path, fleet_hosts, inventory_hosts
from .ssh import _host_keys_env, _ssh_args, connect_timeout
from .strategy import STRATEGY_ENV, _strategy_env, default_strategy

# Keep this many runs' artifacts (events, stdout) in the state directory.
KEEP_ARTIFACTS = 20


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

"""The only package that talks to ansible-runner.

It validates what can be validated before any host is touched, runs a playbook,
turns ansible-runner's event stream into progress callbacks and per-host results,
and turns connection failures into one-line errors that name the fix.

From the bottom up (a module imports only those above it in this list):
    batches    --batch and --max-fail of a rolling run
    forks      how many hosts a run works on at once
    strategy   Ansible's linear strategy or Mitogen's, per playbook
    inventory  the inventory, --limit and tags checked before any host is contacted
    ssh        the command's SSH master sockets, the connect timeout, why a host was unreachable
    interrupt  SIGINT and SIGTERM ending the run's processes
    events     ansible-runner's events folded into per-host results
    runner     run_playbook: one playbook run, its environment and artifacts

A setting a module reads at run time (KEEP_ARTIFACTS, INTERRUPT_GRACE_SECONDS, ssh's _MUX and
_connect_timeout) is changed in that module (engine.runner, engine.interrupt, engine.ssh): the
names below are copies.
"""

from __future__ import annotations

from ..runs import RunResult
from .batches import MAX_FAIL_VAR, SERIAL_VAR, Batch, parse_batch, parse_max_fail
from .events import INPUT_CHECK_VAR, KEEP_ALL_EVENTS_HOSTS, _EventCollector, diffs_of, input_check_plays
from .forks import FORK_MEMORY_BYTES, FORKS_ENV, RESERVED_MEMORY_BYTES, forks_for
from .interrupt import (
    _INTERRUPT,
    INTERRUPT_GRACE_SECONDS,
    INTERRUPT_SIGNALS,
    RUN_MARKER_ENV,
    _marked,
    end_run_processes,
    forward_to_runs,
    interrupted,
    interruptible,
)
from .inventory import (
    check_limit,
    check_tags,
    ensure_tools_on_path,
    fleet_hosts,
    inventory_hosts,
    known_tags,
    resolve_inventory,
)
from .runner import KEEP_ARTIFACTS, _run_env, rotate_artifacts, run_playbook
from .ssh import (
    CONTROL_PERSIST_SECONDS,
    DEFAULT_CONNECT_TIMEOUT,
    _Multiplexer,
    close_connections,
    close_masters,
    connect_timeout,
    explain_unreachable,
    set_connect_timeout,
    shared_ssh_masters,
)
from .strategy import DEFAULT_STRATEGY, MITOGEN_PLAYBOOKS, STRATEGY_ENV, _strategy_env, default_strategy

__all__ = [
    "CONTROL_PERSIST_SECONDS",
    "DEFAULT_CONNECT_TIMEOUT",
    "DEFAULT_STRATEGY",
    "FORKS_ENV",
    "FORK_MEMORY_BYTES",
    "INPUT_CHECK_VAR",
    "INTERRUPT_GRACE_SECONDS",
    "INTERRUPT_SIGNALS",
    "KEEP_ALL_EVENTS_HOSTS",
    "KEEP_ARTIFACTS",
    "MAX_FAIL_VAR",
    "MITOGEN_PLAYBOOKS",
    "RESERVED_MEMORY_BYTES",
    "RUN_MARKER_ENV",
    "SERIAL_VAR",
    "STRATEGY_ENV",
    "_INTERRUPT",
    "Batch",
    "RunResult",
    "_EventCollector",
    "_Multiplexer",
    "_marked",
    "_run_env",
    "_strategy_env",
    "check_limit",
    "check_tags",
    "close_connections",
    "close_masters",
    "connect_timeout",
    "default_strategy",
    "diffs_of",
    "end_run_processes",
    "ensure_tools_on_path",
    "explain_unreachable",
    "fleet_hosts",
    "forks_for",
    "forward_to_runs",
    "input_check_plays",
    "interrupted",
    "interruptible",
    "inventory_hosts",
    "known_tags",
    "parse_batch",
    "parse_max_fail",
    "resolve_inventory",
    "rotate_artifacts",
    "run_playbook",
    "set_connect_timeout",
    "shared_ssh_masters",
]

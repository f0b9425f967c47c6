"""Many cases of one play in a single ansible-playbook run: one inventory host per case.

Starting ansible-playbook costs seconds of CPU, so the tests that feed a role's checks one bad
option each give every case a host of its own (its variables are the case's input) and run the
play once; the JSON callback reports each task's result per host, so each case still gets a
test of its own that reads its host's results.

Inventory host variables lose to play variables and -e, and win over role defaults: a case whose
input must come from -e needs a run of its own. A check that runs once for all hosts (run_once)
or stops them all (any_errors_fatal, max_fail_percentage) would mix the cases: the roles' checks
these runs cover use neither.

With pytest-xdist the cases of one module may land on both workers: the first to ask runs the
play, the other waits for it and reads its result from the session's shared temporary directory
(once(), also for runs made another way).
"""

from __future__ import annotations

import fcntl
import hashlib
import json
import os
import subprocess
import sys
from collections.abc import Callable, Mapping, Sequence
from dataclasses import asdict, dataclass, field
from functools import cached_property
from pathlib import Path
from typing import Any

import pytest
import yaml

ROOT = Path(__file__).resolve().parents[2]
BINDIR = Path(sys.executable).parent


def local_env(**overrides: str) -> dict[str, str]:
    """The environment the role tests run ansible-playbook with from the checkout (its ansible.cfg)."""
    return {
        **os.environ,
        "PATH": f"{BINDIR}:{os.environ.get('PATH', '')}",
        "ANSIBLE_NOCOLOR": "1",
        "ANSIBLE_STDOUT_CALLBACK": "ansible.builtin.json",
        "ANSIBLE_LOCALHOST_WARNING": "false",
        **overrides,
    }


def local_host(variables: Mapping[str, Any]) -> dict[str, Any]:
    """A case's host on this machine: ansible runs its tasks locally with the venv's Python."""
    return {"ansible_connection": "local", "ansible_python_interpreter": sys.executable, **variables}


@dataclass
class Run:
    returncode: int
    stdout: str
    stderr: str
    hosts: list[str] = field(default_factory=list)
    workdir: str = ""

    def tail(self) -> str:
        return self.stdout[-3000:] + self.stderr[-2000:]

    @cached_property
    def report(self) -> dict:
        """The JSON callback's output."""
        try:
            return json.loads(self.stdout)
        except json.JSONDecodeError:
            pytest.fail("ansible-playbook printed no JSON report:\n" + self.tail())

    def results(self, host: str) -> list[tuple[str, dict]]:
        """(task name, result) of every task that ran on HOST (or skipped it), in order."""
        assert host in self.hosts, f"no case host {host}"
        return [
            (t["task"]["name"], t["hosts"][host])
            for play in self.report["plays"]
            for t in play["tasks"]
            if host in t["hosts"]
        ]

    def failed(self, host: str) -> list[tuple[str, dict]]:
        return [(name, result) for name, result in self.results(host) if result.get("failed")]

    def stats(self, host: str) -> dict:
        return self.report["stats"][host]


def _shared_dir(tmp_path_factory: pytest.TempPathFactory) -> Path:
    base = tmp_path_factory.getbasetemp()
    # Under xdist each worker has its own base directory inside the session's one.
    return base.parent if os.environ.get("PYTEST_XDIST_WORKER") else base


def once(tmp_path_factory: pytest.TempPathFactory, key: str, make: Callable[[Path], dict]) -> dict:
    """MAKE(DIR)'s result (JSON), made once per test session for KEY, whichever xdist worker asks
    first; DIR is its own directory in the session's shared temporary directory."""
    shared = _shared_dir(tmp_path_factory)
    done = shared / f"{key}.json"
    with open(shared / f"{key}.lock", "w") as lock:
        fcntl.flock(lock, fcntl.LOCK_EX)
        if done.exists():
            return json.loads(done.read_text())
        workdir = shared / key
        workdir.mkdir()
        result = make(workdir)
        part = done.with_suffix(".part")
        part.write_text(json.dumps(result))
        part.rename(done)
        return result


def run_cases(
    tmp_path_factory: pytest.TempPathFactory,
    name: str,
    play: Sequence[dict],
    hosts: Mapping[str, Mapping[str, Any]],
    *,
    args: Sequence[str] = (),
    env: Callable[[Path], dict[str, str]] = lambda workdir: local_env(),
    cwd: Path | None = None,
) -> Run:
    """Run PLAY once over HOSTS (name -> that case's variables) and return the run.

    The run gets a directory of its own (-e cases_dir=DIR), which is also its working directory
    unless CWD is given. Within a test session the same NAME and input run only once.
    """
    inputs = json.dumps([play, hosts, list(args)], sort_keys=True, default=str)
    key = f"{name}-{hashlib.sha256(inputs.encode()).hexdigest()[:12]}"

    def make(workdir: Path) -> dict:
        inventory = workdir / "inventory.json"
        inventory.write_text(json.dumps({"all": {"hosts": {h: dict(v) for h, v in hosts.items()}}}, indent=1))
        playbook = workdir / "play.yml"
        playbook.write_text(yaml.safe_dump(list(play), sort_keys=False))
        proc = subprocess.run(
            [str(BINDIR / "ansible-playbook"), "-i", str(inventory), str(playbook), "-e", f"cases_dir={workdir}", *args],
            cwd=cwd or workdir,
            capture_output=True,
            text=True,
            timeout=600,
            env=env(workdir),
        )
        return asdict(Run(proc.returncode, proc.stdout, proc.stderr, list(hosts), str(workdir)))

    return Run(**once(tmp_path_factory, key, make))

"""Figures for the mlstack role: wheelhouse build (cold and cached), offline install into a fresh
lab server, the no-op re-run, the environment's size and the doctor's verdict there.

    .venv/bin/python benchmarks/mlstack_install.py [--components core gbdt torch hpo serving]
        [--repeats 3] [--also tensorflow distributed] [--skip-cold] [--rsync]

The components default to the role's default stack (provisioner.bundle.DEFAULT_COMPONENTS).
The cold build downloads into a temporary directory (the cache under /var/cache/provisioner is
not touched by it); the install uses the cached wheelhouse (built first if needed).  The install
is repeated --repeats times on one freshly booted lab server (between repeats the environment,
the wheels copied to the server and the role's record are removed, so each repeat installs
from nothing); the medians are printed with the spread.  --also then adds more components to
the same environment and runs the doctor with everything imported together (one OpenMP
runtime across all of them).  --rsync also times `rsync -a` of the same wheels to the server
(needs rsync here; installs it there), for comparison with the role's copy.  Figures, never
pass/fail: these machines are shared and noisy.
"""

from __future__ import annotations

import argparse
import json
import os
import re
import shutil
import statistics
import subprocess
import sys
import tempfile
import time
from pathlib import Path

import yaml

from provisioner import bundle, lab

ROOT = Path(__file__).resolve().parents[1]
BINDIR = Path(sys.executable).parent
NAME = "pv-bench-mlstack"


def playbook(roles: list[str]) -> list[dict]:
    return [{"name": "Bench", "hosts": "all", "gather_facts": True, "gather_subset": ["min"],
             "roles": [{"role": r} for r in roles]}]


def ansible(server: lab.LabServer, roles: list[str], variables: dict, tmp: Path) -> tuple[float, str]:
    book = tmp / f"{'-'.join(roles)}.yml"
    book.write_text(yaml.safe_dump(playbook(roles), sort_keys=False))
    extra = tmp / "vars.json"
    extra.write_text(json.dumps(variables))
    env = {**os.environ, "PATH": f"{BINDIR}:{os.environ.get('PATH', '')}", "ANSIBLE_CONFIG": str(ROOT / "ansible.cfg"),
           "ANSIBLE_ROLES_PATH": str(ROOT / "roles"), "ANSIBLE_NOCOLOR": "1",
           "ANSIBLE_CALLBACKS_ENABLED": "ansible.posix.profile_tasks"}
    started = time.monotonic()
    r = subprocess.run([str(BINDIR / "ansible-playbook"), "-i", str(server.inventory), "-e", f"@{extra}", str(book)],
                       cwd=ROOT, capture_output=True, text=True, env=env)
    seconds = time.monotonic() - started
    if r.returncode != 0:
        sys.exit(f"ansible-playbook {', '.join(roles)} failed ({r.returncode}):\n{r.stdout[-3000:]}")
    return seconds, r.stdout


def task_seconds(output: str, task: str) -> float | None:
    text = re.sub(r"\s+", " ", output)
    m = re.search(re.escape(task) + r" -+ ([0-9.]+)s", text)
    return float(m.group(1)) if m else None


def changed(output: str) -> int:
    m = re.search(r"changed=(\d+)", output.split("PLAY RECAP")[-1])
    return int(m.group(1)) if m else -1


def ssh(server: lab.LabServer, command: str) -> str:
    r = subprocess.run(["ssh", "-F", str(server.ssh_config), server.name, command], capture_output=True, text=True,
                       timeout=600)
    return r.stdout + r.stderr


FRESH = ("rm -rf /opt/mlstack /opt/mlstack-envs /var/cache/provisioner/mlstack-wheelhouse "
         "/var/lib/provisioner/originals/mlstack.json /etc/provisioner/expected/mlstack.json")
STEPS = ("Pack the missing wheels on the control node", "Copy and unpack the missing wheels on the target",
         "Create the virtual environment with the system Python", "Install the pinned packages",
         "Install venv support and the OpenMP runtime")


def spread(values: list[float]) -> str:
    """The median and the range of VALUES (seconds)."""
    if len(values) == 1:
        return f"{values[0]:.1f} s (1 run)"
    return f"{statistics.median(values):.1f} s median of {len(values)} ({min(values):.1f}-{max(values):.1f})"


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--components", nargs="+", default=list(bundle.DEFAULT_COMPONENTS))
    parser.add_argument("--wheelhouse", type=Path, default=bundle.default_wheelhouse())
    parser.add_argument("--repeats", type=int, default=3, help="installs from nothing on the server (default 3)")
    parser.add_argument("--also", nargs="*", default=[], help="components added afterwards, for the doctor with all")
    parser.add_argument("--skip-cold", action="store_true", help="don't time a cold build (saves a download)")
    parser.add_argument("--rsync", action="store_true", help="also time rsync -a of the wheels to the server")
    parser.add_argument("--name", default=NAME, help=f"the lab server's name (default {NAME})")
    args = parser.parse_args()
    if args.repeats < 1:
        parser.error("--repeats must be 1 or more")
    figures: list[tuple[str, str]] = []

    if not args.skip_cold:
        with tempfile.TemporaryDirectory(prefix="mlstack-cold-") as cold:
            res = bundle.build_wheelhouse(Path(cold), args.components)
            figures.append(("wheelhouse build, cold", f"{res.seconds:.1f} s, {len(res.files)} wheels, {res.bytes / 1e6:.0f} MB"))
    warm = bundle.build_wheelhouse(args.wheelhouse, [*args.components, *args.also])
    figures.append(("wheelhouse build, cached", f"{warm.seconds:.2f} s ({warm.downloaded} downloaded, {warm.reused} reused)"))
    stack = bundle.build_wheelhouse(args.wheelhouse, args.components)
    figures.append((f"wheels of {', '.join(stack.components)}", f"{len(stack.files)} wheels, {stack.bytes / 1e6:.0f} MB"))

    variables = {"mlstack_components": args.components, "mlstack_wheelhouse": str(args.wheelhouse)}
    doctor = ""
    with tempfile.TemporaryDirectory(prefix="mlstack-bench-") as tmp_name:
        tmp = Path(tmp_name)
        try:
            started = time.monotonic()
            server = lab.up(args.name)
            figures.append(("lab server boot", f"{time.monotonic() - started:.1f} s"))
            prep, _ = ansible(server, ["plan", "common", "thread_env"], variables, tmp)
            figures.append(("plan + common + thread_env (fresh server)", f"{prep:.1f} s"))
            installs: list[float] = []
            steps: dict[str, list[float]] = {}
            for repeat in range(args.repeats):
                if repeat:
                    ssh(server, FRESH)
                seconds, out = ansible(server, ["plan", "mlstack"], variables, tmp)
                installs.append(seconds)
                for task in STEPS:
                    s = task_seconds(out, f"mlstack : {task}")
                    if s is not None:
                        steps.setdefault(task, []).append(s)
            figures.append(("mlstack install from the wheelhouse (with facts and plan)", spread(installs)))
            for task, values in steps.items():
                figures.append((f"  {task}", spread(values)))
            again, out2 = ansible(server, ["plan", "mlstack"], variables, tmp)
            figures.append(("mlstack re-run", f"{again:.1f} s, changed={changed(out2)}"))
            size = ssh(server, "du -sm /opt/mlstack/ /var/cache/provisioner/mlstack-wheelhouse | cut -f1").split()
            figures.append(("installed size (/opt/mlstack)", f"{size[0]} MB (wheels kept on the target: {size[1]} MB)"))
            if args.rsync:
                if not shutil.which("rsync"):
                    sys.exit("--rsync needs rsync on this machine: apt-get install rsync")
                ssh(server, "apt-get install -y -qq rsync >/dev/null 2>&1")
                files = [str(args.wheelhouse / f) for f in stack.files]
                for label in ("rsync -a of the same wheels (comparison)", "rsync -a again (nothing to send)"):
                    started = time.monotonic()
                    subprocess.run(["rsync", "-a", "-e", f"ssh -F {server.ssh_config}", *files,
                                    f"{server.name}:/var/tmp/rsync-wheels/"], check=True, capture_output=True)
                    figures.append((label, f"{time.monotonic() - started:.1f} s"))
            if args.also:
                more = {**variables, "mlstack_components": [*args.components, *args.also]}
                seconds, _ = ansible(server, ["plan", "mlstack"], more, tmp)
                size = ssh(server, "du -sm /opt/mlstack/ | cut -f1").split()
                figures.append((f"adding {', '.join(args.also)}", f"{seconds:.1f} s, then {size[0]} MB"))
            doctor = ssh(server, "runuser -l ml -c /opt/mlstack/bin/mlstack-doctor")
        finally:
            lab.down(args.name)
    width = max(len(k) for k, _ in figures)
    for key, value in figures:
        print(f"{key.ljust(width)}  {value}")
    print("\nmlstack-doctor on the lab server:\n" + doctor)


if __name__ == "__main__":
    main()

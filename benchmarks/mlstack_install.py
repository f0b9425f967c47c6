"""Figures for the mlstack role: wheelhouse build (cold and cached), offline install into a fresh
lab server, the no-op re-run, the environment's size and the doctor's verdict there.

    .venv/bin/python benchmarks/mlstack_install.py [--components core gbdt torch] [--rsync]

The cold build downloads into a temporary directory (the cache under /var/cache/provisioner is
not touched by it); the install uses the cached wheelhouse (built first if needed).  --rsync
also times `rsync -a` of the same wheels to the server (needs rsync here; installs it there),
for comparison with the role's per-wheel copy.  Figures, never pass/fail: these machines are
shared and noisy.
"""

from __future__ import annotations

import argparse
import json
import os
import re
import shutil
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


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--components", nargs="+", default=["core", "gbdt", "torch"])
    parser.add_argument("--wheelhouse", type=Path, default=bundle.default_wheelhouse())
    parser.add_argument("--skip-cold", action="store_true", help="don't time a cold build (saves a download)")
    parser.add_argument("--rsync", action="store_true", help="also time rsync -a of the wheels to the server")
    args = parser.parse_args()
    figures: list[tuple[str, str]] = []

    if not args.skip_cold:
        with tempfile.TemporaryDirectory(prefix="mlstack-cold-") as cold:
            res = bundle.build_wheelhouse(Path(cold), args.components)
            figures.append(("wheelhouse build, cold", f"{res.seconds:.1f} s, {len(res.files)} wheels, {res.bytes / 1e6:.0f} MB"))
    warm = bundle.build_wheelhouse(args.wheelhouse, args.components)
    figures.append(("wheelhouse build, cached", f"{warm.seconds:.2f} s ({warm.downloaded} downloaded, {warm.reused} reused)"))

    variables = {"mlstack_components": args.components, "mlstack_wheelhouse": str(args.wheelhouse)}
    with tempfile.TemporaryDirectory(prefix="mlstack-bench-") as tmp_name:
        tmp = Path(tmp_name)
        try:
            started = time.monotonic()
            server = lab.up(NAME)
            figures.append(("lab server boot", f"{time.monotonic() - started:.1f} s"))
            prep, _ = ansible(server, ["plan", "common", "thread_env"], variables, tmp)
            figures.append(("plan + common + thread_env (fresh server)", f"{prep:.1f} s"))
            first, out = ansible(server, ["plan", "mlstack"], variables, tmp)
            figures.append(("mlstack install, fresh server (with facts and plan)", f"{first:.1f} s"))
            for task in ("Pack the missing wheels on the control node", "Copy and unpack the missing wheels on the target",
                         "Create the virtual environment with the system Python",
                         "Install the pinned packages", "Install venv support and the OpenMP runtime"):
                s = task_seconds(out, f"mlstack : {task}")
                if s is not None:
                    figures.append((f"  {task}", f"{s:.1f} s"))
            again, out2 = ansible(server, ["plan", "mlstack"], variables, tmp)
            figures.append(("mlstack re-run", f"{again:.1f} s, changed={changed(out2)}"))
            size = ssh(server, "du -sm /opt/mlstack /var/cache/provisioner/mlstack-wheelhouse | cut -f1").split()
            figures.append(("venv size", f"{size[0]} MB (wheels kept on the target: {size[1]} MB)"))
            if args.rsync:
                if not shutil.which("rsync"):
                    sys.exit("--rsync needs rsync on this machine: apt-get install rsync")
                ssh(server, "apt-get install -y -qq rsync >/dev/null 2>&1")
                files = [str(args.wheelhouse / f) for f in warm.files]
                started = time.monotonic()
                subprocess.run(["rsync", "-a", "-e", f"ssh -F {server.ssh_config}", *files,
                                f"{server.name}:/var/tmp/rsync-wheels/"], check=True, capture_output=True)
                figures.append(("rsync -a of the same wheels (comparison)", f"{time.monotonic() - started:.1f} s"))
                started = time.monotonic()
                subprocess.run(["rsync", "-a", "-e", f"ssh -F {server.ssh_config}", *files,
                                f"{server.name}:/var/tmp/rsync-wheels/"], check=True, capture_output=True)
                figures.append(("rsync -a again (nothing to send)", f"{time.monotonic() - started:.1f} s"))
            doctor = ssh(server, "runuser -l ml -c /opt/mlstack/bin/mlstack-doctor")
        finally:
            lab.down(NAME)
    width = max(len(k) for k, _ in figures)
    for key, value in figures:
        print(f"{key.ljust(width)}  {value}")
    print("\nmlstack-doctor on the lab server:\n" + doctor)


if __name__ == "__main__":
    main()

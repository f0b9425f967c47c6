"""Figures for the ML environment's generations on a lab server, from a wheelhouse: the first
build, the no-op re-run, a lock change to the switch (one small package changed: its steps), the
switch itself, `provisioner rollback`, and the disk each generation takes.

    .venv/bin/python benchmarks/mlstack_generations.py [--components core gbdt serving] [--repeats 3]

The lock change is one small package to an older version (prometheus-client 0.26.0 -> 0.25.0,
0.24.1, 0.24.0: one per repeat; threadpoolctl 3.8.0 -> 3.7.0, 3.6.0, 3.5.0 without the serving
component), from the cached wheelhouse plus those wheels; each repeat builds a new generation from a
copy of the live one, then rolls back to it.
Figures, never pass/fail: these machines are shared and noisy.
"""

from __future__ import annotations

import argparse
import json
import subprocess
import sys
import tempfile
import time
from pathlib import Path

import yaml
from mlstack_install import ansible, changed, spread, ssh, task_seconds

from provisioner import bundle, lab

BINDIR = Path(sys.executable).parent
NAME = "pv-bench-gen"
STEPS = (
    "Prepare the new generation from the live one",
    "Remove the packages the lock no longer pins from the new generation",
    "Install the pinned packages",
    "Byte-compile the environment on every core",
    "Prove the new generation with the doctor, as its owner in a login shell",
    "Run a few workloads in the new generation",
    "Switch the environment to the new generation (one rename)",
)


def lock_with(path: Path, old: str, new: str) -> Path:
    lock = yaml.safe_load(bundle.DEFAULT_LOCK.read_text())
    lock["components"] = {c: [new if p == old else p for p in pins] for c, pins in lock["components"].items()}
    path.write_text(yaml.safe_dump(lock, sort_keys=False))
    return path


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--components", nargs="+", default=["core", "gbdt", "serving"])
    parser.add_argument("--repeats", type=int, default=3)
    parser.add_argument("--name", default=NAME)
    args = parser.parse_args()
    if args.repeats < 1:
        parser.error("--repeats must be 1 or more")
    if args.repeats > 3:
        parser.error("--repeats must be 3 or fewer (one older version of the package per repeat)")
    package, old, olders = (
        ("prometheus-client", "0.26.0", ("0.25.0", "0.24.1", "0.24.0"))
        if "serving" in args.components
        else ("threadpoolctl", "3.8.0", ("3.7.0", "3.6.0", "3.5.0"))
    )
    changes = [f"{package}=={v}" for v in olders[: args.repeats]]
    old = f"{package}=={old}"
    figures: list[tuple[str, str]] = []
    with tempfile.TemporaryDirectory(prefix="mlstack-gen-") as tmp_name:
        tmp = Path(tmp_name)
        house = tmp / "wheels"
        house.mkdir()
        wheels = list(bundle.build_wheelhouse(bundle.default_wheelhouse(), args.components).path.glob("*.whl"))
        for i, change in enumerate(changes):
            one = tmp / f"one-{i}.lock"
            one.write_text(
                yaml.safe_dump(
                    {"schema": 1, "python_version": "3.11", "glibc": "2.28", "arch": "x86_64", "components": {"core": [change]}}
                )
            )
            wheels += bundle.build_wheelhouse(tmp / f"extra-{i}", ["core"], lock_path=one).path.glob("*.whl")
        for wheel in wheels:
            if not (house / wheel.name).exists():
                (house / wheel.name).symlink_to(wheel)
        base = {"mlstack_components": args.components, "mlstack_wheelhouse": str(house)}
        first_lock = lock_with(tmp / "a.lock", old, old)
        try:
            server = lab.up(args.name)
            ansible(server, ["plan", "common"], base, tmp)
            seconds, _ = ansible(server, ["plan", "mlstack"], {**base, "mlstack_lock_file": str(first_lock)}, tmp)
            figures.append((f"first generation ({', '.join(args.components)})", f"{seconds:.1f} s"))
            seconds, out = ansible(server, ["plan", "mlstack"], {**base, "mlstack_lock_file": str(first_lock)}, tmp)
            figures.append(("re-run, same lock", f"{seconds:.1f} s, changed={changed(out)}"))
            runs: list[float] = []
            steps: dict[str, list[float]] = {}
            rollbacks: list[float] = []
            for repeat, change in enumerate(changes):
                lock = lock_with(tmp / f"change-{repeat}.lock", old, change)
                seconds, out = ansible(server, ["plan", "mlstack"], {**base, "mlstack_lock_file": str(lock)}, tmp)
                runs.append(seconds)
                for task in STEPS:
                    s = task_seconds(out, f"mlstack : {task}")
                    if s is not None:
                        steps.setdefault(task, []).append(s)
                started = time.monotonic()
                r = subprocess.run(
                    [str(BINDIR / "provisioner"), "rollback", "-i", str(server.inventory)], capture_output=True, text=True
                )
                rollbacks.append(time.monotonic() - started)
                if r.returncode != 0:
                    sys.exit(f"provisioner rollback failed:\n{r.stdout[-2000:]}{r.stderr[-2000:]}")
            figures.append(("lock change to the switch (whole run, with facts and plan)", spread(runs)))
            for task, values in steps.items():
                figures.append((f"  {task}", spread(values)))
            figures.append(("provisioner rollback (whole command)", spread(rollbacks)))
            history = json.loads(ssh(server, "cat /opt/mlstack-envs/generations.json"))
            for name, build in sorted(history["builds"].items(), key=lambda kv: kv[1]["built"]):
                figures.append(
                    (
                        f"generation {name}",
                        f"{build['bytes'] / 1e6:.0f} MB, of it its own (not shared"
                        f" with the generation it was copied from) {build['own_bytes'] / 1e6:.0f} MB",
                    )
                )
        finally:
            lab.down(args.name)
    width = max(len(k) for k, _ in figures)
    for key, value in figures:
        print(f"{key.ljust(width)}  {value}")
    print(f"\nmedians of {args.repeats}; the switch is one rename of a symlink: no moment without /opt/mlstack")


if __name__ == "__main__":
    main()

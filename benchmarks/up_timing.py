"""Times `provisioner up` on a fresh lab server and its no-op re-runs; prints medians.

    .venv/bin/python benchmarks/up_timing.py [--reruns 5]

Figures, never pass/fail: these machines are noisy, so medians and ranges are printed.
"""

from __future__ import annotations

import argparse
import json
import statistics
import subprocess
import sys
import time
from pathlib import Path

from provisioner import lab

BIN = Path(sys.executable).parent / "provisioner"


def timed(*args: str) -> tuple[float, dict]:
    started = time.monotonic()
    r = subprocess.run([str(BIN), *args, "--json"], capture_output=True, text=True)
    seconds = time.monotonic() - started
    if r.returncode != 0:
        sys.exit(f"provisioner {' '.join(args)} failed ({r.returncode}): {r.stderr.strip()}")
    return seconds, json.loads(r.stdout)["data"]


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--reruns", type=int, default=5)
    args = parser.parse_args()
    name = "pv-bench-up"
    try:
        started = time.monotonic()
        server = lab.up(name)
        boot = time.monotonic() - started
        inv = str(server.inventory)
        from provisioner import bundle

        wheelhouse = bundle.build_wheelhouse(bundle.default_wheelhouse(), list(bundle.DEFAULT_COMPONENTS)).path
        offline = ("-e", f"mlstack_wheelhouse={wheelhouse}")
        first, _ = timed("up", "-i", inv, "--no-verify", *offline)
        reruns, common_only = [], []
        for _ in range(args.reruns):
            seconds, out = timed("up", "-i", inv, "--no-verify", *offline)
            assert all(h["changed"] == 0 for h in out["hosts"].values()), "re-run changed something"
            reruns.append(seconds)
            seconds, _ = timed("up", "-i", inv, "--no-verify", "--tags", "common", *offline)
            common_only.append(seconds)
        verify, _ = timed("verify", "-i", inv)
    finally:
        lab.down(name)
    print(f"lab server boot (up to sshd answering): {boot:.1f} s")
    print(f"provisioner up, fresh lab server:        {first:.1f} s")
    print(f"no-op re-run, all roles (median of {len(reruns)}): {statistics.median(reruns):.1f} s "
          f"(min {min(reruns):.1f}, max {max(reruns):.1f})")
    print(f"no-op re-run, common only (median of {len(common_only)}): {statistics.median(common_only):.1f} s "
          f"(min {min(common_only):.1f}, max {max(common_only):.1f})")
    print(f"provisioner verify:                      {verify:.1f} s")


if __name__ == "__main__":
    main()

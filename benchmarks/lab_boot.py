"""Median lab server up (to sshd answering) and down times over N runs.

Usage: python benchmarks/lab_boot.py [--runs 5] [--name pv-bench]
Needs root and systemd-nspawn (see provisioner.lab). Prints figures; asserts nothing.
"""

from __future__ import annotations

import argparse
import statistics
import sys
import time

from provisioner import lab


def timed(func, *args) -> float:
    start = time.perf_counter()
    func(*args)
    return time.perf_counter() - start


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--runs", type=int, default=5)
    parser.add_argument("--name", default="pv-bench")
    args = parser.parse_args(argv)

    problem = lab.missing_requirement()
    if problem:
        print(f"skipped: {problem}", file=sys.stderr)
        return 2
    print(f"ensure_rootfs: {timed(lab.ensure_rootfs):.2f} s (cached after the first build)")
    ups: list[float] = []
    downs: list[float] = []
    try:
        lab.down(args.name)  # a leftover from an interrupted run
        for run in range(1, args.runs + 1):
            ups.append(timed(lab.up, args.name))
            downs.append(timed(lab.down, args.name))
            print(f"run {run}: up {ups[-1]:.2f} s, down {downs[-1]:.2f} s")
    finally:
        lab.down(args.name)
    print(
        f"median over {len(ups)} runs: up {statistics.median(ups):.2f} s "
        f"(min {min(ups):.2f}, max {max(ups):.2f}), down {statistics.median(downs):.2f} s "
        f"(min {min(downs):.2f}, max {max(downs):.2f})"
    )
    return 0


if __name__ == "__main__":
    sys.exit(main())

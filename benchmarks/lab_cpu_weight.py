"""What other work on this machine does to an OpenMP fit, and what a lab server's cpu cgroup gives back.

    .venv/bin/python benchmarks/lab_cpu_weight.py [--runs 3] [--busy N] [--weight 1000] [--python PY]

LightGBM's fit (30 trees, depth 8, 250,000 x 28, the library's default threads: every CPU), as
medians of --runs fits each, and their ratio to the idle one:
- idle;
- beside N busy loops (default: one per CPU), each in a session of its own, as the suite's other
  worker's processes are;
- the same, the fit run with `nice -n -10` in a session of its own (a container's every login is);
- the same, the fit inside a cpu cgroup of weight --weight (provisioner.lab.cpu, what
  `lab up --cpu-weight` gives a server), the loops left where they are.

PY is a Python with lightgbm and numpy; by default a venv made from the lab's wheelhouse
(bundle.default_wheelhouse()) in a temporary directory. Needs root (the cgroup). Figures, never
pass/fail.
"""

from __future__ import annotations

import argparse
import os
import statistics
import subprocess
import sys
import tempfile
import time
from pathlib import Path

from provisioner import bundle
from provisioner.lab import cpu

# Not a lab server's name (those take no "_"): the benchmark never joins or removes a server's group.
GROUP = "bench_cpu_weight"

FIT = """
import time, numpy as np, lightgbm as lgb
rng = np.random.default_rng(0)
x = rng.standard_normal((250_000, 28)).astype(np.float32)
y = (x[:, 0] + rng.standard_normal(250_000) > 0).astype(np.int32)
ds = lgb.Dataset(x, label=y, params={"verbose": -1, "max_bin": 255})
ds.construct()
t = time.perf_counter()
lgb.train({"objective": "binary", "num_leaves": 255, "max_depth": 8, "verbose": -1, "force_col_wise": True}, ds, 30)
print(time.perf_counter() - t)
"""


def python_with_lightgbm(where: Path) -> str:
    wheels = bundle.default_wheelhouse()
    subprocess.run([sys.executable, "-m", "venv", str(where)], check=True)
    subprocess.run(
        [str(where / "bin" / "pip"), "install", "-q", "--no-index", "--find-links", str(wheels), "numpy", "lightgbm"],
        check=True,
    )
    return str(where / "bin" / "python")


def fit(command: list[str]) -> float:
    out = subprocess.run(command, capture_output=True, text=True, check=True, start_new_session=True).stdout
    return float(out.split()[-1])


def main() -> None:
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("--runs", type=int, default=3)
    ap.add_argument("--busy", type=int, default=os.cpu_count() or 2)
    ap.add_argument("--weight", type=int, default=1000)
    ap.add_argument("--python")
    args = ap.parse_args()
    with tempfile.TemporaryDirectory() as tmp:
        py = args.python or python_with_lightgbm(Path(tmp) / "venv")
        plain = [py, "-c", FIT]
        figures: dict[str, list[float]] = {"idle": [fit(plain) for _ in range(args.runs)]}
        loops: list[subprocess.Popen[bytes]] = []
        try:
            procs = cpu.create(GROUP, args.weight)
            loops += [subprocess.Popen(["sh", "-c", "while :; do :; done"], start_new_session=True) for _ in range(args.busy)]
            time.sleep(1)
            busy = f"beside {args.busy} busy loops"
            figures[busy] = [fit(plain) for _ in range(args.runs)]
            figures[f"{busy}, nice -10"] = [fit(["nice", "-n", "-10", *plain]) for _ in range(args.runs)]
            figures[f"{busy}, cpu weight {args.weight}"] = [fit(cpu.joined(plain, procs)) for _ in range(args.runs)]
        finally:
            for loop in loops:
                loop.kill()
                loop.wait()
            cpu.remove(GROUP)
    idle = statistics.median(figures["idle"])
    print(f"LightGBM fit, 30 trees on 250,000 x 28, every CPU ({os.cpu_count()}); medians of {args.runs}")
    for what, times in figures.items():
        median = statistics.median(times)
        print(f"  {what:<45} {median:7.2f} s  {median / idle:5.1f}x idle  ({', '.join(f'{t:.2f}' for t in times)})")


if __name__ == "__main__":
    main()

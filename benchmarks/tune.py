"""provisioner tune on a provisioned host: per knob, the rule's figure against each candidate's in
one interleaved run, and the time tune took; prints medians, never pass/fail.

    .venv/bin/python benchmarks/tune.py -i INVENTORY [--limit HOST] [--budget 10m] [--workloads features,sklearn]

Runs `provisioner tune --json` (the proposal only: nothing is written) and prints, per host,
workload, knob and candidate: the median of the rule's and of the candidate's figures over the
pairs, the median pair ratio (above 1: the candidate is better) with its interquartile spread, the
pairs, the verdict; then the wall time against the budget. A study resumed from an earlier run
shows its pairs without figures: remove /var/lib/provisioner/tune on the host for a fresh one.
"""

from __future__ import annotations

import argparse
import json
import statistics
import subprocess
import sys
import time
from pathlib import Path

ROOT = Path(__file__).resolve().parents[1]


def main() -> int:
    ap = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    ap.add_argument("-i", "--inventory", required=True)
    ap.add_argument("--limit")
    ap.add_argument("--budget", default="10m")
    ap.add_argument("--workloads")
    args = ap.parse_args()
    cmd = [str(ROOT / ".venv/bin/provisioner"), "tune", "-i", args.inventory, "--budget", args.budget, "--json"]
    cmd += ["--limit", args.limit] if args.limit else []
    cmd += ["--workloads", args.workloads] if args.workloads else []
    started = time.monotonic()
    run = subprocess.run(cmd, capture_output=True, text=True, check=False)
    wall = time.monotonic() - started
    try:
        envelope = json.loads(run.stdout)
    except ValueError:
        print(run.stdout, run.stderr, file=sys.stderr)
        return 1
    data = envelope.get("data") or {}
    for host, result in (data.get("results") or {}).items():
        print(f"{host}: {result.get('cores')} cores, tune took {result.get('seconds')} s of a {result.get('budget_s')} s budget")
        for workload, entry in result.get("workloads", {}).items():
            for knob, record in entry.get("knobs", {}).items():
                if "skipped" in record:
                    print(f"  {workload}.{knob}: skipped: {record['skipped']}")
                    continue
                for c in record.get("candidates", []):
                    figures = c.get("figures") or []
                    ratios = c.get("ratios") or []
                    rule = statistics.median([f["rule"] for f in figures if "rule" in f]) if figures else None
                    cand = statistics.median([f["candidate"] for f in figures if "candidate" in f]) if figures else None
                    q = statistics.quantiles(ratios, n=4, method="inclusive") if len(ratios) > 1 else [0, 0, 0]
                    med = statistics.median(ratios) if ratios else None
                    print(
                        f"  {workload}.{knob}: rule {record['rule']} vs {c['label']}: "
                        f"{rule and f'{rule:,.1f}'} -> {cand and f'{cand:,.1f}'} {entry['unit']}; "
                        f"median ratio {med and f'{med:.3f}'} (IQR {q[0]:.3f}-{q[2]:.3f}), {len(ratios)} pairs; "
                        f"{'KEPT' if c.get('kept') else 'not kept'}: {c.get('reason') or c.get('error')}"
                    )
    print(f"wall time of the command: {wall:.0f} s; exit {envelope.get('exit_code')}")
    for line in envelope.get("messages", []) + envelope.get("errors", []):
        print(f"  {line}")
    return 0


if __name__ == "__main__":
    raise SystemExit(main())

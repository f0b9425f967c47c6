#!/usr/bin/env python3
"""The model server's state on this host, as one JSON object (read-only).

Run by playbooks/serve_status.yml with the ML environment's Python (for prometheus_client's
parser): reads the serving config, asks each worker's admin port (loopback) for its models
and its metrics twice, a second apart, for the request rate, and systemd for each unit.

Exit 0 with the JSON on stdout; exit 2 with one line on stderr when the host has no serving
config (the model server was never deployed there).
"""

from __future__ import annotations

import argparse
import json
import subprocess
import sys
import time
import urllib.error
import urllib.request
from typing import Any

from prometheus_client.parser import text_string_to_metric_families

UNIT = "provisioner-serve@{index}.service"


def fetch(url: str, timeout: float) -> bytes:
    with urllib.request.urlopen(url, timeout=timeout) as response:  # the admin ports are on loopback
        return response.read()


def requests_by_code(metrics_text: str) -> dict[str, float]:
    """provisioner_serving_requests_total summed per HTTP status code."""
    out: dict[str, float] = {}
    for family in text_string_to_metric_families(metrics_text):
        if family.name != "provisioner_serving_requests":
            continue
        for sample in family.samples:
            if sample.name.endswith("_total"):
                code = str(sample.labels.get("code", "?"))
                out[code] = out.get(code, 0.0) + sample.value
    return out


def unit_state(index: int) -> dict[str, Any]:
    """ActiveState, MainPID, NRestarts and CPUAffinity of one worker unit, from systemctl show."""
    shown = subprocess.run(
        ["systemctl", "show", UNIT.format(index=index), "-p", "ActiveState,SubState,MainPID,NRestarts,CPUAffinity"],
        capture_output=True,
        text=True,
        check=False,
    )
    props = dict(line.split("=", 1) for line in shown.stdout.splitlines() if "=" in line)
    return {
        "unit": UNIT.format(index=index),
        "active": props.get("ActiveState", "unknown"),
        "sub": props.get("SubState", ""),
        "pid": int(props.get("MainPID") or 0) or None,
        "restarts": int(props["NRestarts"]) if props.get("NRestarts", "").isdigit() else None,
        "cpu_affinity": props.get("CPUAffinity", ""),
    }


def read_worker(config: dict[str, Any], worker: dict[str, Any], timeout: float) -> dict[str, Any]:
    """One worker's unit state, models, readiness and request counters (a first read)."""
    index = int(worker["index"])
    base = f"http://127.0.0.1:{int(config['admin_port_base']) + index}"
    out: dict[str, Any] = {"index": index, "threads": worker.get("threads"), "cpus": worker.get("cpus", []), "url": base}
    out.update(unit_state(index))
    try:
        out["_first"] = requests_by_code(fetch(base + "/metrics", timeout).decode())
        out["_at"] = time.monotonic()
        models = json.loads(fetch(base + "/v1/models", timeout))
        try:
            fetch(base + "/readyz", timeout)
            out["ready"] = True
        except urllib.error.HTTPError:
            out["ready"] = False
    except (OSError, ValueError) as exc:
        out.update({"answering": False, "error": f"{base}: {exc}"})
        return out
    loaded = [m for m in models.get("models", []) if m.get("loaded")]
    out.update(
        {
            "answering": True,
            "loaded_versions": [f"{m['name']}/{m['version']}" for m in loaded],
            # What predicts each loaded version and its single-row time at load (docs/serving.md).
            "engines": {
                f"{m['name']}/{m['version']}": {"engine": m.get("engine"), "predict_us": m.get("predict_us")} for m in loaded
            },
            "cache_bytes": models.get("cache_bytes"),
            "cache_budget_bytes": models.get("cache_budget_bytes"),
        }
    )
    return out


def add_rates(out: dict[str, Any], timeout: float) -> dict[str, Any]:
    """The second read of a worker's counters: requests/s and non-2xx answers/s since the first."""
    first = out.pop("_first", None)
    at = out.pop("_at", None)
    if first is None or at is None:
        return out
    try:
        second = requests_by_code(fetch(out["url"] + "/metrics", timeout).decode())
    except (OSError, ValueError) as exc:
        out.update({"answering": False, "error": f"{out['url']}: {exc}"})
        return out
    elapsed = max(1e-3, time.monotonic() - at)
    errors_then = sum(v for code, v in first.items() if not code.startswith("2"))
    errors_now = sum(v for code, v in second.items() if not code.startswith("2"))
    out["requests_per_s"] = round((sum(second.values()) - sum(first.values())) / elapsed, 1)
    out["errors_per_s"] = round((errors_now - errors_then) / elapsed, 1)
    out["requests_total"] = sum(second.values())
    return out


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--config", required=True)
    parser.add_argument("--interval", type=float, default=1.0, help="seconds between the two metric reads")
    parser.add_argument("--timeout", type=float, default=5.0)
    args = parser.parse_args(argv)
    try:
        with open(args.config) as handle:
            config = json.load(handle)
    except FileNotFoundError:
        print(
            f"no serving config at {args.config}: the model server is not deployed on this host "
            "(set serving_enabled: true or serving_model_sources, then provisioner up)",
            file=sys.stderr,
        )
        return 2
    except (OSError, ValueError) as exc:
        print(f"cannot read the serving config {args.config}: {exc}", file=sys.stderr)
        return 2
    workers = [read_worker(config, w, args.timeout) for w in config.get("workers", [])]
    time.sleep(args.interval)
    workers = [add_rates(w, args.timeout) for w in workers]
    print(
        json.dumps(
            {
                "listen": f"{config.get('listen')}:{config.get('port')}",
                "registry": config.get("registry"),
                "workers": workers,
                "requests_per_s": round(sum(w.get("requests_per_s") or 0.0 for w in workers), 1),
            }
        )
    )
    return 0


if __name__ == "__main__":
    sys.exit(main())

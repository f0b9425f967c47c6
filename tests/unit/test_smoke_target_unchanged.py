"""What the smoke script runs on a host stays as it is while its workloads move: the quick and
full sizes of every workload, the order of the tasks (the default run and the cluster's), the
worker entry points and the workloads the role accepts are compared, whole, with
smoke_target_golden.json.

Regenerate it only for an intended change of a size, a task or a worker:
.venv/bin/python tests/unit/test_smoke_target_unchanged.py
"""

from __future__ import annotations

import json
from pathlib import Path
from typing import Any

import smoke_script
import yaml

ROOT = Path(__file__).resolve().parents[2]
GOLDEN = Path(__file__).parent / "data" / "smoke_target_golden.json"


def target() -> dict[str, Any]:
    script = smoke_script.load()
    specs = yaml.safe_load((ROOT / "roles" / "smoke" / "meta" / "argument_specs.yml").read_text())
    workloads = specs["argument_specs"]["main"]["options"]["smoke_workloads"]
    return {
        "profiles": script.PROFILES,
        "tasks": list(script.TASKS),
        "cluster_tasks": list(script.CLUSTER_TASKS),
        "workers": sorted(script.WORKERS),
        "role_workload_choices": workloads.get("choices"),
    }


def test_sizes_tasks_and_workers_are_unchanged() -> None:
    assert target() == json.loads(GOLDEN.read_text())


if __name__ == "__main__":
    GOLDEN.write_text(json.dumps(target(), indent=1, sort_keys=True) + "\n")

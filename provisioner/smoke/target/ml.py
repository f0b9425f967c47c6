"""Helpers of the workloads' measuring functions, which run in the ML environment's Python (as the
ML user in tuned mode, as root with an empty environment in baseline mode): standard library at
the top, like everything the zipapp holds; the libraries are imported where they measure."""

from __future__ import annotations

import os
import statistics
from typing import Any


def median(values: list[float]) -> float:
    return float(statistics.median(values)) if values else float("nan")


def _blas_threads() -> int | None:
    """The BLAS threads this process runs now, as threadpoolctl reads them (None: no BLAS loaded)."""
    from threadpoolctl import threadpool_info

    return max((i["num_threads"] for i in threadpool_info() if i.get("user_api") == "blas"), default=None)


def _env_default(tuned: bool, *names: str) -> str:
    """How a run without a limit got its threads: the environment's variables, or the library default."""
    if not tuned:
        return "library default"
    shown = ", ".join(f"{n}={os.environ[n]}" for n in names if n in os.environ)
    return f"library default with the environment's {shown}" if shown else "library default (no thread variable set)"


def _missing(module: str, component: str) -> dict[str, Any] | None:
    import importlib.util

    if importlib.util.find_spec(module) is None:
        return {"skipped": f"{module} is not installed in this environment (component {component})"}
    return None


def _data(rows: int, cols: int, seed: int = 0):
    import numpy as np

    rng = np.random.default_rng(seed)
    x = rng.standard_normal((rows, cols), dtype=np.float32)
    w = rng.standard_normal(cols).astype(np.float32)
    logit = x @ w * 0.5 + 0.8 * np.sin(x[:, 0] * x[:, 1]) + rng.standard_normal(rows, dtype=np.float32) * 0.5
    return x, (logit > 0).astype(np.float32)


def _planned(p: dict[str, Any], key: str, fallback: int, how: str) -> tuple[int, str]:
    """A plan value for this workload, or `fallback` (derived here, said so) when the plan has none."""
    value = (p.get("plan") or {}).get(key)
    if value is not None:
        return int(value), f"the plan's {key}"
    return int(fallback), f"{how} (the plan has no {key})"


def _env_int(name: str) -> int | str:
    """A count from the environment, or 'library default' when the variable is not set."""
    try:
        return int(os.environ[name])
    except (KeyError, ValueError):
        return "library default"

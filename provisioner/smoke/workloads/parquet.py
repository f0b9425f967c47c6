"""A Parquet scan from the data mount against the mount's raw read and the decode rate.

Measured on the target (WORKERS, in the ML environment); judged on the control node, which
reads results.parquet: scan_gbps, scan_s, raw_read_gbps,
in_memory_gbps, scan_threads, file_bytes, rows, write_gbps, decoded_gbps, cold_cache,
cache_note; the raw result's threads and data_dir.
"""

from __future__ import annotations

import os
import time
from typing import Any

from ..base import Check, Objective, _problem, grade, span
from ..target.ml import _missing, median

NAME = "parquet"
# The plan values whose change moves its figures: what the tuner may search (registry: KNOBS).
KNOBS: tuple[str, ...] = ("arrow_cpu_threads", "arrow_io_threads")
# What `provisioner tune` maximises: one cold scan of the file from the data mount. Tuned only when named
# (`--workloads parquet`): each measurement drops the host's whole page cache.
TUNE = Objective("GB/s scanned", True, lambda r: float(r["scan_gbps"]))
TUNE_WHEN_NAMED = True


# ---------------------------------------------------------------- target, ML environment

SIZES: dict[str, dict[str, Any]] = {
    "quick": {"parquet_rows": 4_000_000, "parquet_repeats": 3},
    "full": {"parquet_rows": 40_000_000, "parquet_repeats": 5},
}


def w_parquet_write(p: dict[str, Any]) -> dict[str, Any]:
    missing = _missing("pyarrow", "core")
    if missing:
        return missing
    import numpy as np
    import pyarrow as pa
    import pyarrow.parquet as pq

    rows = SIZES[p["profile"]]["parquet_rows"]
    rng = np.random.default_rng(3)
    cols = {f"f{i}": rng.standard_normal(rows, dtype=np.float32) for i in range(12)}
    cols.update({f"c{i}": rng.integers(0, 1000, rows, dtype=np.int32) for i in range(4)})
    cols["ts"] = np.arange(rows, dtype=np.int64)
    table = pa.table(cols)
    path = os.path.join(p["workdir"], "smoke.parquet")
    t0 = time.perf_counter()
    pq.write_table(table, path, compression="snappy", row_group_size=1 << 20)
    secs = time.perf_counter() - t0
    size = os.path.getsize(path)
    return {
        "path": path,
        "rows": rows,
        "file_bytes": size,
        "table_bytes": table.nbytes,
        "compression": "snappy",
        "write_s": secs,
        "write_gbps": size / secs / 1e9,
        "pyarrow": pa.__version__,
    }


def w_parquet_scan(p: dict[str, Any]) -> dict[str, Any]:
    import pyarrow as pa
    import pyarrow.dataset  # read_table imports it on first use: here as long as the scan itself
    import pyarrow.parquet as pq

    t0 = time.perf_counter()
    table = pq.read_table(p["path"], use_threads=True)
    secs = time.perf_counter() - t0
    if p.get("tune"):  # tune's measurement: the scan alone, and the IO pool it ran with (the candidate's)
        return {"seconds": secs, "decoded_bytes": table.nbytes, "io_threads": pa.io_thread_count()}
    decoded = table.nbytes
    # The scan's table freed first: a decode while it was alive ran here at 37-80% of the rate of one
    # after it was freed, which let the scan come out above its limit.
    del table
    # The same file decoded from memory, the faster of two: what the CPU can decode with no drive
    # involved and its memory already the process's.
    with open(p["path"], "rb") as f:
        buf = pa.py_buffer(f.read())
    in_memory = []
    for _ in range(2):
        t0 = time.perf_counter()
        pq.read_table(pa.BufferReader(buf), use_threads=True)
        in_memory.append(time.perf_counter() - t0)
    return {"seconds": secs, "decoded_bytes": decoded, "threads": pa.cpu_count(), "in_memory_s": min(in_memory)}


WORKERS = {"parquet_write": w_parquet_write, "parquet_scan": w_parquet_scan}


# ---------------------------------------------------------------- target, root parent (stdlib)


def drop_caches() -> str | None:
    """Drop the page cache so a read comes from the drive; None on success, else why not."""
    os.sync()
    try:
        with open("/proc/sys/vm/drop_caches", "w", encoding="ascii") as f:
            f.write("3\n")
        return None
    except OSError as exc:
        return f"cannot drop the page cache ({exc.strerror}: /proc/sys/vm is read-only here): warm-cache figures"


def sequential_read(path: str) -> float:
    """Seconds to read a file start to end in 8 MiB chunks."""
    start = time.perf_counter()
    with open(path, "rb", buffering=0) as f:
        while f.read(8 << 20):
            pass
    return time.perf_counter() - start


def drive(runner: Any) -> dict[str, Any]:
    """Write a Parquet file on the data mount, then per repeat: the raw file read and the scan, both cold."""
    written = runner.worker("parquet_write")
    if "error" in written or "skipped" in written:
        return written
    raw, scans, decoded, in_memory, cache = [], [], [], [], None
    for _ in range(SIZES[runner.args.profile]["parquet_repeats"]):
        cache = drop_caches() or cache
        raw.append(sequential_read(written["path"]))
        cache = drop_caches() or cache
        scan = runner.worker("parquet_scan", path=written["path"])
        if "error" in scan:
            return scan
        scans.append(scan["seconds"])
        decoded.append(scan["decoded_bytes"])
        in_memory.append(scan["in_memory_s"])
    return {
        **written,
        "cold_cache": cache is None,
        "cache_note": cache,
        "raw_read_s": raw,
        "scan_s": scans,
        "raw_read_gbps": written["file_bytes"] / median(raw) / 1e9,
        "scan_gbps": written["file_bytes"] / median(scans) / 1e9,
        "decoded_gbps": median(decoded) / median(scans) / 1e9,
        "in_memory_s": in_memory,
        # The limit: the fastest decode from memory of every repeat, as the CPU's rate is a bound.
        "in_memory_gbps": written["file_bytes"] / min(in_memory) / 1e9,
        "scan_threads": scan.get("threads"),
    }


def tune_prepare(runner: Any) -> dict[str, Any]:
    """The file tune's scans read, written once per run on the data mount (as the smoke test writes it)
    before any scan is timed: {} when ready, else why not (a page cache that cannot be dropped: every scan
    would decode from memory, and the IO pool would have nothing to wait on)."""
    cache = drop_caches()
    if cache:
        return {"skipped": f"{cache.removesuffix(': warm-cache figures')}: every scan would read memory, not the drive"}
    written = runner.worker("parquet_write")
    if "error" in written or "skipped" in written:
        return written
    runner.tune_state[NAME] = written
    return {}


def tune_drive(runner: Any, _values: dict[str, Any], env: dict[str, str | None]) -> dict[str, Any]:
    """One tune measurement: the page cache dropped (where it can be), then one scan of tune_prepare's file
    by a worker in the ML user's login shell with the candidate's variables ENV on top."""
    written = runner.tune_state.get(NAME)
    if written is None:  # the driver prepares a workload before its first pair
        return {"error": "parquet: nothing prepared for the measurement (tune_prepare did not succeed)"}
    cache = drop_caches()
    if cache:
        return {"error": f"parquet: {cache}"}
    scan = runner.worker("parquet_scan", env=env, path=written["path"], tune=True)
    if "error" in scan or "skipped" in scan:
        return scan
    wanted = env.get("ARROW_IO_THREADS")
    if wanted is not None and scan.get("io_threads") != int(wanted):
        # A variable the login shell or Arrow did not pass on: the figure would be another count's.
        return {"error": f"parquet: the scan ran with {scan.get('io_threads')} IO threads, not ARROW_IO_THREADS={wanted}"}
    return {"scan_gbps": written["file_bytes"] / scan["seconds"] / 1e9, "io_threads": scan.get("io_threads")}


# ---------------------------------------------------------------- control node

PARQUET_GRADES = (0.5, 0.2)
# Parquet decode with snappy, per core (measured on these machines).
SNAPPY_DECODE_GBPS_PER_CORE = 1.4


def parquet_check(raw: dict[str, Any], pq: dict[str, Any]) -> Check:
    title = "Parquet scan from the data mount"
    problem = _problem("data.parquet", "data", title, pq)
    if problem:
        return problem
    threads = int(pq.get("scan_threads") or raw.get("threads") or 1)
    if pq.get("in_memory_gbps"):
        decode, how = pq["in_memory_gbps"], "the fastest decode of the same file from memory"
    else:
        decode, how = threads * SNAPPY_DECODE_GBPS_PER_CORE, f"snappy decode at {SNAPPY_DECODE_GBPS_PER_CORE} GB/s per thread"
    disk = pq["raw_read_gbps"]
    limit = min(disk, decode)
    bound = "the mount's sequential read" if disk <= decode else f"decoding ({threads} threads)"
    cache = "cold cache" if pq.get("cold_cache") else "warm cache: " + str(pq.get("cache_note") or "")
    basis = f"min(the same file read raw from the mount: {disk:.2f} GB/s, {how}: {decode:.2f} GB/s); bound by {bound}; {cache}"
    ratio = pq["scan_gbps"] / limit
    status = grade(ratio, PARQUET_GRADES)
    reason = f"{ratio:.0%} of {bound}"
    detail = (
        f"{pq['file_bytes'] / 1e6:.0f} MB snappy ({pq['rows']:,} rows), write {pq['write_gbps']:.2f} GB/s, "
        f"decoded {pq['decoded_gbps']:.2f} GB/s, {threads} threads, median of {len(pq.get('scan_s', []))}, "
        f"on {raw.get('data_dir')}"
    )
    return Check("data.parquet", "data", title, status, reason, pq["scan_gbps"], "GB/s", limit, basis, ratio, detail=detail)


def checks(raw: dict[str, Any], result: dict[str, Any]) -> list[Check]:
    return [parquet_check(raw, result)]


def spreads(pq: dict[str, Any]) -> dict[str, list[float] | None]:
    """GB/s of each scan: the file's bytes over its time."""
    if pq.get("file_bytes") and pq.get("scan_s"):
        return {"data.parquet": span([pq["file_bytes"] / t / 1e9 for t in pq["scan_s"]])}
    return {}

"""A Parquet scan from the data mount against the mount's raw read and the decode rate.

Runs on the control node. Reads results.parquet: scan_gbps, scan_s, raw_read_gbps,
in_memory_gbps, scan_threads, file_bytes, rows, write_gbps, decoded_gbps, cold_cache,
cache_note; the raw result's threads and data_dir.
"""

from __future__ import annotations

from typing import Any

from ..base import Check, _problem, grade, span

NAME = "parquet"

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
        decode, how = pq["in_memory_gbps"], "the same file decoded from memory"
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

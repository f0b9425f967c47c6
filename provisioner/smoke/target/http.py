"""The model server's load, for the serving workload's root parent (standard library only): wrk's
output read, one HTTP request, and the environment a worker gets for the plan's allocator."""

from __future__ import annotations

import json
import os
import re
import sysconfig
import urllib.error
import urllib.request
from typing import Any

_TIME_UNITS_MS = {"us": 0.001, "ms": 1.0, "s": 1000.0, "m": 60_000.0, "h": 3_600_000.0}


def _ms(value: str, unit: str) -> float:
    return float(value) * _TIME_UNITS_MS[unit]


def parse_wrk(text: str) -> dict[str, Any]:
    """wrk --latency output -> requests/s, latency percentiles (ms), requests, socket errors, non-2xx."""
    rps = re.search(r"^Requests/sec:\s+([\d.]+)", text, re.M)
    if not rps:
        tail = text.strip().splitlines()
        raise ValueError(f"wrk printed no Requests/sec line: {tail[-1] if tail else 'no output'}")
    out: dict[str, Any] = {"requests_per_s": float(rps.group(1))}
    for pct, value, unit in re.findall(r"^\s+(\d+(?:\.\d+)?)%\s+([\d.]+)(us|ms|s|m|h)\s*$", text, re.M):
        out[f"p{float(pct):g}_ms"] = _ms(value, unit)
    lat = re.search(r"^\s+Latency\s+([\d.]+)(us|ms|s|m|h)\s+[\d.]+\w+\s+([\d.]+)(us|ms|s|m|h)", text, re.M)
    if lat:
        out["mean_ms"], out["max_ms"] = _ms(lat.group(1), lat.group(2)), _ms(lat.group(3), lat.group(4))
    done = re.search(r"^\s+(\d+) requests in ([\d.]+)(us|ms|s|m|h)", text, re.M)
    if done:
        out["requests"], out["seconds"] = int(done.group(1)), _ms(done.group(2), done.group(3)) / 1000
    sock = re.search(r"Socket errors: connect (\d+), read (\d+), write (\d+), timeout (\d+)", text)
    out["socket_errors"] = (
        dict(zip(("connect", "read", "write", "timeout"), map(int, sock.groups()), strict=True)) if sock else {}
    )
    non2xx = re.search(r"Non-2xx or 3xx responses: (\d+)", text)
    out["non_2xx"] = int(non2xx.group(1)) if non2xx else 0
    return out


def _http(url: str, body: bytes | None = None, timeout: float = 5.0) -> tuple[int, Any]:
    """(status, JSON body or text) of a GET, or a POST of `body`; status 0 when nothing answers."""
    headers = {"Content-Type": "application/json"} if body is not None else {}
    req = urllib.request.Request(url, data=body, headers=headers, method="POST" if body is not None else "GET")
    try:
        with urllib.request.urlopen(req, timeout=timeout) as resp:
            status, raw = resp.status, resp.read()
    except urllib.error.HTTPError as exc:
        status, raw = exc.code, exc.read()
    except (OSError, ValueError):
        return 0, None
    try:
        return status, json.loads(raw)
    except ValueError:
        return status, raw.decode("utf-8", "replace")[:300]


JEMALLOC = "libjemalloc.so.2"  # role allocator's library (Debian's libjemalloc2)


def lib_dirs() -> list[str]:
    """Where this host's own libraries are: Debian's directory of its architecture (this Python's, the
    system one), then /usr/lib; never another architecture's (a library ld.so would ignore)."""
    multiarch = sysconfig.get_config_var("MULTIARCH")
    return [*([f"/usr/lib/{multiarch}"] if multiarch else []), "/usr/lib"]


def allocator_env(allocator: str | None) -> dict[str, str]:
    """What a worker's environment gets for ALLOCATOR (the plan's serving allocator), as role allocator's
    drop-in gives it: jemalloc's library in LD_PRELOAD; glibc's malloc: nothing."""
    if allocator in (None, "glibc"):
        return {}
    found = [os.path.join(d, JEMALLOC) for d in lib_dirs() if os.path.exists(os.path.join(d, JEMALLOC))]
    if allocator != "jemalloc" or not found:
        raise RuntimeError(
            f"no {JEMALLOC} for allocator {allocator} (the Debian package libjemalloc2; role allocator installs it)"
        )
    return {"LD_PRELOAD": os.path.realpath(found[0])}


def check_loaded(pids: list[int], env: dict[str, str]) -> None:
    """Raise unless every process of PIDS mapped the library ENV preloads (ld.so ignores one it
    cannot load, with a warning only: the measurement would be glibc's under jemalloc's name)."""
    library = env.get("LD_PRELOAD")
    for i, pid in enumerate(pids):
        try:
            with open(f"/proc/{pid}/maps", encoding="utf-8", errors="replace") as f:
                mapped = library in f.read() if library else True
        except OSError as exc:
            raise RuntimeError(f"model server worker {i}: cannot read its memory map ({exc})") from None
        if not mapped:
            raise RuntimeError(f"model server worker {i} did not load {library} (LD_PRELOAD ignored)")

"""The host's own checks before any workload: whether it was idle, and whether the tuning is in
place as the plan says (threads in a login shell and a systemd service, THP, the governor, the
data mount).

Runs on the control node. Reads the raw result's cpu_busy_before, cpu.logical_cpus, config,
plan, data_dir, data_dir_requested and which workloads ran (results).
"""

from __future__ import annotations

from typing import Any

from .base import FAIL, INFO, PASS, SKIP, WARN, Check

# More than this share of the CPUs busy just before the run: the host was not idle.
BUSY_SHARE = 0.25


def load_check(raw: dict[str, Any]) -> Check:
    """Whether other work ran on the CPUs: it lowers every figure without anything being wrong."""
    busy = float(raw["cpu_busy_before"])
    cpus = int(raw.get("cpu", {}).get("logical_cpus") or 1)
    status = PASS if busy <= BUSY_SHARE else WARN
    reason = f"{busy:.0%} of {cpus} CPUs busy in the second before the run"
    if status == WARN:
        reason += ": other work was running, so the figures below may be low for reasons outside this host's tuning"
    return Check(
        "host.load",
        "host",
        "idle host",
        status,
        reason,
        busy * 100,
        "% busy",
        BUSY_SHARE * 100,
        "/proc/stat over one second before the first workload",
        busy / BUSY_SHARE,
        higher_is_better=False,
    )


def config_checks(raw: dict[str, Any]) -> list[Check]:
    cfg, plan = raw.get("config", {}), raw.get("plan", {})
    threads = plan.get("threads_per_job")
    out = []
    for key, title in (
        ("login_shell", "thread settings in a login shell"),
        ("systemd_service", "thread settings in a systemd service"),
    ):
        seen = cfg.get(key, {})
        cid = f"config.threads.{key}"
        if "not_applicable" in seen:
            out.append(Check(cid, "configuration", title, SKIP, f"not applicable: {seen['not_applicable']}"))
            continue
        if "error" in seen:
            out.append(Check(cid, "configuration", title, FAIL, f"could not read it: {seen['error']}"))
            continue
        values = seen.get("values", {})
        wrong = {
            v: values.get(v)
            for v in ("OMP_NUM_THREADS", "OPENBLAS_NUM_THREADS", "MKL_NUM_THREADS")
            if values.get(v) != str(threads)
        }
        shown = ", ".join(f"{k}={v}" for k, v in sorted(values.items())) or "none set"
        if wrong:
            reason = "; ".join(f"{k} is {v or 'unset'}" for k, v in wrong.items())
            out.append(
                Check(cid, "configuration", title, FAIL, f"{reason}, the plan says {threads} (role thread_env)", detail=shown)
            )
        else:
            out.append(Check(cid, "configuration", title, PASS, f"{threads} threads per job, as planned", detail=shown))
    thp = cfg.get("thp", {})
    for name in ("enabled", "defrag"):
        want, have = plan.get(f"thp_{name}"), thp.get(name)
        cid = f"config.thp.{name}"
        if want is None:
            out.append(Check(cid, "configuration", f"THP {name}", INFO, f"{have}; the plan sets nothing"))
        elif have == want:
            out.append(Check(cid, "configuration", f"THP {name}", PASS, f"{have}, as planned"))
        else:
            out.append(
                Check(
                    cid,
                    "configuration",
                    f"THP {name}",
                    FAIL,
                    f"{have}, the plan says {want} (role cpu_tuning; read-only in containers)",
                )
            )
    gov = cfg.get("governor", {})
    want = plan.get("cpu_governor")
    if "not_applicable" in gov or want is None:
        out.append(
            Check(
                "config.governor",
                "configuration",
                "CPU governor",
                SKIP,
                f"not applicable: {gov.get('not_applicable', 'the plan sets none')}",
            )
        )
    else:
        st = PASS if gov.get("value") == want else FAIL
        out.append(
            Check(
                "config.governor",
                "configuration",
                "CPU governor",
                st,
                f"{gov.get('value')}" + ("" if st == PASS else f", the plan says {want}"),
            )
        )
    mount = cfg.get("data_mount", {})
    requested = raw.get("data_dir_requested")
    if "error" in mount:
        out.append(Check("config.data_mount", "configuration", "data mount", FAIL, mount["error"]))
    elif requested and raw.get("data_dir") == requested:
        noatime = "noatime" in mount.get("options", [])
        out.append(
            Check(
                "config.data_mount",
                "configuration",
                "data mount",
                PASS if noatime else WARN,
                f"{mount.get('fstype')} on {mount.get('source')} at {mount.get('target')}"
                + ("" if noatime else ", mounted without noatime (every read writes an access time)"),
                detail=",".join(mount.get("options", [])),
            )
        )
    else:
        out.append(
            Check(
                "config.data_mount",
                "configuration",
                "data mount",
                INFO,
                f"no data mount at {requested}: "
                + ("the Parquet workload ran on" if "parquet" in raw.get("results", {}) else "work files go to")
                + f" {mount.get('target')} ({mount.get('fstype')} on {mount.get('source')})",
            )
        )
    return out

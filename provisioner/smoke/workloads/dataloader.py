"""A DataLoader over Parquet shards feeding a small network: samples/s against the same training
on batches in memory, the share of the loop waiting for data, and num_workers=0.

Runs on the control node. Reads results.dataloader: planned, in_memory, workers0
{samples_per_s, wait_share, threads}, workers, workers_how, threads, threads_how, rows,
features, shards, shard_bytes, where, batch, epochs, network, torch.
"""

from __future__ import annotations

from typing import Any

from ..base import FAIL, INFO, PASS, WARN, Check, _problem, against_limit

NAME = "dataloader"

# A DataLoader feeding training against the same training on batches in memory (the workers and
# the training threads share the cores: half of it passes); the share of
# the loop spent waiting for the next batch (pass within, warn within, in %).
LOADER_GRADES = (0.5, 0.25)
LOADER_WAIT_PCT = (20.0, 50.0)


def dataloader_checks(raw: dict[str, Any], dl: dict[str, Any]) -> list[Check]:
    """A DataLoader over Parquet shards feeding a small network: samples/s against the same training
    on batches already in memory, the share of the loop spent waiting for data, and num_workers=0."""
    group = "data loading"
    problem = _problem("dataloader.samples", group, "DataLoader feeding training", dl)
    if problem:
        return [problem]
    planned, limit_run, zero = dl["planned"], dl["in_memory"], dl["workers0"]
    fig, limit = planned["samples_per_s"], limit_run["samples_per_s"]
    ratio = fig / limit
    setup = f"{dl['workers']} worker(s) ({dl['workers_how']}) + {dl['threads']} training thread(s) ({dl['threads_how']})"
    reason = f"{setup}: {ratio:.0%} of the in-memory rate, {fig / zero['samples_per_s']:.2f}x num_workers=0"
    status, reason = against_limit(
        ratio,
        LOADER_GRADES,
        reason,
        "the in-memory run",
        "the loop waits for data: more loader workers, or fewer training threads beside them",
        above=1.05,
    )
    detail = (
        f"{dl['rows']:,} rows x {dl['features']} in {dl['shards']} snappy shards ({dl['shard_bytes'] / 1e6:.0f} MB) "
        f"on {dl['where']}, batch {dl['batch']}, {dl['epochs']} epoch(s), {dl['network']}; torch {dl['torch']}"
    )
    out = [
        Check(
            "dataloader.samples",
            group,
            "DataLoader feeding training",
            status,
            reason,
            fig,
            "samples/s",
            limit,
            f"the same training on the batches already in memory ({limit:,.0f} samples/s, "
            f"{dl['threads']} thread(s)): the loop never waits",
            ratio,
            detail=detail,
        )
    ]
    wait = planned["wait_share"] * 100
    ok, warn = LOADER_WAIT_PCT
    status = PASS if wait <= ok else WARN if wait <= warn else FAIL
    out.append(
        Check(
            "dataloader.wait",
            group,
            "training loop waiting for data",
            status,
            f"{wait:.0f}% of the loop in next(batch) with {dl['workers']} worker(s); "
            f"{zero['wait_share'] * 100:.0f}% with num_workers=0",
            wait,
            "% of the loop",
            ok,
            f"within {ok:.0f}% passes, within {warn:.0f}% warns",
            wait / ok,
            higher_is_better=False,
            detail=setup,
        )
    )
    out.append(
        Check(
            "dataloader.workers0",
            group,
            "DataLoader with num_workers=0",
            INFO,
            f"decoding in the training process, {zero.get('threads')} thread(s): "
            f"{zero['wait_share'] * 100:.0f}% of the loop waiting",
            zero["samples_per_s"],
            "samples/s",
        )
    )
    return out


def checks(raw: dict[str, Any], result: dict[str, Any]) -> list[Check]:
    return dataloader_checks(raw, result)

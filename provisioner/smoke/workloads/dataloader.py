"""A DataLoader over Parquet shards feeding a small network: samples/s against the same training
on batches in memory, the share of the loop waiting for data, and num_workers=0.

Measured on the target (WORKERS, in the ML environment); judged on the control node, which
reads results.dataloader: planned, in_memory, workers0
{samples_per_s, wait_share, threads}, workers, workers_how, threads, threads_how, rows,
features, shards, shard_bytes, where, batch, epochs, network, torch.
"""

from __future__ import annotations

import os
import time
from typing import Any

from ..base import FAIL, INFO, PASS, WARN, Check, Objective, _problem, against_limit
from ..target.ml import _missing, _planned

NAME = "dataloader"
# The plan values whose change moves its figures: what the tuner may search (registry: KNOBS).
KNOBS: tuple[str, ...] = ("dataloader_workers", "dataloader_threads")
# What `provisioner tune` optimises: samples/s of the training fed by the environment's DataLoader
# workers (the in-memory and num_workers=0 references are not run).
TUNE = Objective("samples/s", True, lambda r: float(r["planned"]["samples_per_s"]))


# ---------------------------------------------------------------- target, ML environment

SIZES: dict[str, dict[str, Any]] = {
    "quick": {"loader_rows": 80_000, "loader_shards": 8, "loader_batch": 512, "loader_epochs": 1, "loader_width": 256},
    "full": {"loader_rows": 4_000_000, "loader_shards": 32, "loader_batch": 1024, "loader_epochs": 2, "loader_width": 512},
}


def _from_env(name: str, p: dict[str, Any], key: str, fallback: int, how: str) -> tuple[int, str]:
    """A count a user's script reads from the environment (role thread_env exports it); without
    the variable, the plan's value (or `fallback`), said so."""
    raw = os.environ.get(name, "")
    if raw.isdigit():
        return int(raw), f"{name} from the environment"
    value, whose = _planned(p, key, fallback, how)
    return value, f"{whose}: {name} is not in the environment"


def _write_shards(directory: str, rows: int, shards: int, features: int) -> list[str]:
    import numpy as np
    import pyarrow as pa
    import pyarrow.parquet as pq

    os.makedirs(directory, exist_ok=True)
    rng = np.random.default_rng(51)
    w = rng.standard_normal(features).astype(np.float32)
    paths = []
    per = rows // shards
    for i in range(shards):
        x = rng.standard_normal((per, features), dtype=np.float32)
        cols = {f"f{j}": x[:, j] for j in range(features)}
        cols["label"] = (x @ w > 0).astype(np.float32)
        path = os.path.join(directory, f"shard-{i:03d}.parquet")
        pq.write_table(pa.table(cols), path, compression="snappy", row_group_size=16384)
        paths.append(path)
    return paths


LOADER_FEATURES = 64


def _shard_dataset(paths: list[str], batch: int):
    """An IterableDataset over Parquet shards, each DataLoader worker reading its own; every batch
    decoded, stacked and standardised in the worker (what a data pipeline does before the model)."""
    import numpy as np
    import pyarrow.parquet as pq
    import torch

    class Shards(torch.utils.data.IterableDataset):
        def __iter__(self):
            info = torch.utils.data.get_worker_info()
            mine = paths if info is None else paths[info.id :: info.num_workers]
            for path in mine:
                for rb in pq.ParquetFile(path).iter_batches(batch_size=batch):
                    x = np.stack([rb.column(j).to_numpy() for j in range(LOADER_FEATURES)], axis=1)
                    x = (x - x.mean(axis=0)) / (x.std(axis=0) + 1e-6)
                    label = np.array(rb.column(LOADER_FEATURES).to_numpy(), dtype=np.float32)  # a writable copy
                    yield torch.from_numpy(x), torch.from_numpy(label).unsqueeze(1)

    return Shards()


def w_dataloader(p: dict[str, Any]) -> dict[str, Any]:
    """PyTorch data loading: a DataLoader over Parquet shards on the data mount feeding a small
    network, with the planned workers next to the training threads, against num_workers=0 and
    against the same training on batches already in memory (the loop never waits)."""
    for module, component in (("torch", "torch"), ("pyarrow", "core")):
        missing = _missing(module, component)
        if missing:
            return missing
    import torch

    s = SIZES[p["profile"]]
    tuned = p["mode"] == "tuned"
    cores = p["threads"]
    if tuned:
        # What a training script does with role thread_env's variables (torch reads none itself):
        # DataLoader(num_workers=PROVISIONER_DATALOADER_WORKERS), torch.set_num_threads(PROVISIONER_DATALOADER_THREADS).
        workers, whow = _from_env(
            "PROVISIONER_DATALOADER_WORKERS",
            p,
            "dataloader_workers",
            0 if cores < 2 else max(1, cores // 4),
            "a worker per 4 physical cores, at least 1",
        )
        threads, thow = _from_env(
            "PROVISIONER_DATALOADER_THREADS", p, "dataloader_threads", max(1, cores - workers), "the cores the workers leave"
        )
    else:
        workers, whow, threads, thow = 0, "library default (num_workers=0)", None, "library default"
    paths = _write_shards(os.path.join(p["workdir"], "shards"), s["loader_rows"], s["loader_shards"], LOADER_FEATURES)
    data_bytes = sum(os.path.getsize(f) for f in paths)

    def network():
        torch.manual_seed(0)
        width = s["loader_width"]
        model = torch.nn.Sequential(
            torch.nn.Linear(LOADER_FEATURES, width),
            torch.nn.ReLU(),
            torch.nn.Linear(width, width),
            torch.nn.ReLU(),
            torch.nn.Linear(width, 1),
        )
        return model, torch.optim.SGD(model.parameters(), lr=0.01), torch.nn.BCEWithLogitsLoss()

    def train(batches, epochs: int) -> dict[str, Any]:
        model, opt, loss_fn = network()
        samples, wait, first = 0, 0.0, True
        t_start = None
        for _ in range(epochs):
            it = iter(batches())
            while True:
                t0 = time.perf_counter()
                try:
                    xb, yb = next(it)
                except StopIteration:
                    break
                if first:  # the workers' start and the first batch are not the steady state
                    first, t_start = False, time.perf_counter()
                else:
                    wait += time.perf_counter() - t0
                    samples += len(xb)
                opt.zero_grad()
                loss_fn(model(xb), yb).backward()
                opt.step()
        total = time.perf_counter() - (t_start or time.perf_counter())
        return {
            "samples": samples,
            "seconds": total,
            "samples_per_s": samples / total if total else None,
            "wait_share": wait / total if total else None,
        }

    def loader(num_workers: int):
        return lambda: torch.utils.data.DataLoader(
            _shard_dataset(paths, s["loader_batch"]),
            batch_size=None,
            num_workers=num_workers,
            **({"prefetch_factor": 4, "persistent_workers": False} if num_workers else {}),
        )

    default_threads = torch.get_num_threads()  # the environment's OMP_NUM_THREADS, as torch took it
    if threads:
        torch.set_num_threads(threads)
    in_memory = list(loader(0)())
    train(lambda: in_memory[:20], 1)  # warm: torch's first steps allocate what every later step reuses
    if p.get("tune"):
        planned = train(loader(workers), s["loader_epochs"])
        return {"workers": workers, "workers_how": whow, "threads": threads or torch.get_num_threads(), "planned": planned}
    limit = train(lambda: in_memory, s["loader_epochs"])
    planned = train(loader(workers), s["loader_epochs"])
    # num_workers=0 as a script without the split writes it: torch's own default threads again.
    torch.set_num_threads(default_threads)
    inline = train(loader(0), s["loader_epochs"])
    return {
        "torch": torch.__version__,
        "rows": s["loader_rows"],
        "shards": len(paths),
        "shard_bytes": data_bytes,
        "batch": s["loader_batch"],
        "epochs": s["loader_epochs"],
        "features": LOADER_FEATURES,
        "network": f"MLP {LOADER_FEATURES}-{s['loader_width']}-{s['loader_width']}-1, SGD",
        "workers": workers,
        "workers_how": whow,
        "threads": threads or torch.get_num_threads(),
        "threads_how": thow,
        "planned": planned,
        "in_memory": limit,
        "workers0": {**inline, "threads": torch.get_num_threads()},
        "where": os.path.dirname(paths[0]),
    }


WORKERS = {"dataloader": w_dataloader}


# ---------------------------------------------------------------- control node

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

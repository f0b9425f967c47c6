#!/usr/bin/env python3
"""provisioner's model server: one worker of the serving service, or a check of the registry.

  provisioner_serve.py --config /etc/provisioner/serving/serving.json --worker I
  provisioner_serve.py --config /etc/provisioner/serving/serving.json --check

It runs inside the ML environment (/opt/mlstack/bin/python). A worker takes its slice from
the config (CPUs, threads), loads and warms every listed model version itself (never before a
fork: a worker is a process of its own), then accepts on the serving socket (inherited from
systemd socket activation, or bound with SO_REUSEPORT) and on its own admin port, and tells
systemd READY=1. SIGTERM drains: the worker stops accepting, answers what arrives on its open
connections with `Connection: close` for a short period, then exits 0.

The registry is REGISTRY/NAME/VERSION/metadata.json next to the model file(s); it is trusted
input (root-owned, read-only to the service): scikit-learn models are joblib pickles.

The HTTP server is uvicorn (httptools, uvloop), the metrics prometheus-client; the app under
uvicorn is a plain ASGI callable with no framework between the socket and predict (starlette's
routing, request and response objects cost a quarter of the requests/s). What is written here is
the product's own part: registry, model loading and sizing, the byte-budgeted LRU cache, routes
and input validation, and the socket, readiness and drain handling around uvicorn.

Its parts are the sibling modules next to this file, installed with it (provisioner_serve_*.py):
_config (constants, errors, serving.json, the registry), _models (loading, predicting, --check),
_app (metrics, cache, the HTTP app), _process (threads, CPUs, sockets, systemd); this file runs
a worker and its drain, and keeps every name of those parts for the code that imports it.
"""

from __future__ import annotations

import argparse
import asyncio
import os
import signal
import sys
import time
from pathlib import Path
from typing import Any

# The parts are found next to this file: Python puts a script's own directory first on
# sys.path, and this adds it when the file is loaded as a module from elsewhere.
_HERE = os.path.dirname(os.path.abspath(__file__))
if _HERE not in sys.path:
    sys.path.insert(0, _HERE)

from provisioner_serve_app import Cache, Exchange, Metrics, Worker, _no_constant  # noqa: E402
from provisioner_serve_config import (  # noqa: E402
    _NUMBERS,
    BACKLOG,
    DISCARD_BYTES,
    DISCARD_SECONDS,
    DRAIN_SECONDS,
    EXIT_BAD,
    FRAMEWORKS,
    LATENCY_BUCKETS,
    NAME_RE,
    SD_LISTEN_FDS_START,
    TASKS,
    THREAD_VARS,
    BadInput,
    Metadata,
    ModelError,
    Registry,
    RequestError,
    _int,
    _version_key,
    files_bytes,
    json_object,
    load_config,
)
from provisioner_serve_models import (  # noqa: E402
    _PAGE,
    LOADERS,
    Model,
    Predict,
    _load_catboost,
    _load_lightgbm,
    _load_sklearn,
    _load_torchscript,
    _load_xgboost,
    _size,
    _some,
    _xgboost_dense_predict,
    check,
    listed_versions,
    load_model,
    over_budget_message,
    quiet_output,
    release_memory,
    rss_bytes,
    settle_heap,
)
from provisioner_serve_process import (  # noqa: E402
    _uvicorn_server,
    bind,
    inherited_socket,
    log,
    sd_notify,
    set_affinity,
    set_threads,
)

# Every name the server had before its parts moved out (the smoke test and the benchmark
# load this file and reach for them).
__all__ = [
    "BACKLOG",
    "DISCARD_BYTES",
    "DISCARD_SECONDS",
    "DRAIN_SECONDS",
    "EXIT_BAD",
    "FRAMEWORKS",
    "LATENCY_BUCKETS",
    "LOADERS",
    "NAME_RE",
    "SD_LISTEN_FDS_START",
    "TASKS",
    "THREAD_VARS",
    "_NUMBERS",
    "_PAGE",
    "BadInput",
    "Cache",
    "Exchange",
    "Metadata",
    "Metrics",
    "Model",
    "ModelError",
    "Path",
    "Predict",
    "Registry",
    "RequestError",
    "Worker",
    "_int",
    "_load_catboost",
    "_load_lightgbm",
    "_load_sklearn",
    "_load_torchscript",
    "_load_xgboost",
    "_no_constant",
    "_size",
    "_some",
    "_uvicorn_server",
    "_version_key",
    "_xgboost_dense_predict",
    "bind",
    "check",
    "files_bytes",
    "inherited_socket",
    "json_object",
    "listed_versions",
    "load_config",
    "load_model",
    "log",
    "main",
    "over_budget_message",
    "quiet_output",
    "release_memory",
    "rss_bytes",
    "run_worker",
    "sd_notify",
    "set_affinity",
    "set_threads",
    "settle_heap",
]


async def run_worker(config: dict[str, Any], index: int, config_path: str) -> int:
    worker = Worker(config, index, config_path)
    app = worker.app()
    loop = asyncio.get_running_loop()
    stop = asyncio.Event()

    def on_signal() -> None:
        if not worker.ready:
            log(f"worker {index}: stopped while loading")
            os._exit(0)
        stop.set()

    for sig in (signal.SIGTERM, signal.SIGINT):
        loop.add_signal_handler(sig, on_signal)

    serving_sock = inherited_socket()
    admin_port = config["admin_port_base"] + index
    admin_sock = bind("127.0.0.1", admin_port, False, f"admin port of worker {index}")
    admin = _uvicorn_server(app)
    admin_task = asyncio.create_task(admin.serve(sockets=[admin_sock]))

    models = await asyncio.to_thread(worker.load_listed)
    worker.start_models(models)
    del models
    if serving_sock is None:
        serving_sock = bind(config["listen"], config["port"], True, "serving socket")
    host, port = serving_sock.getsockname()[:2]
    where = f"{host}:{port}"
    serving = _uvicorn_server(app)
    serving_task = asyncio.create_task(serving.serve(sockets=[serving_sock]))
    while not serving.started:
        if serving_task.done() or admin_task.done():
            log(f"worker {index}: the HTTP server did not start")
            return 1
        await asyncio.sleep(0.005)
    worker.ready = True
    sd_notify(f"READY=1\nSTATUS=serving {len(worker.cache.entries)} model versions")
    log(
        f"worker {index}: ready: {len(worker.cache.entries)} versions ({_size(worker.cache.bytes)} of {_size(worker.cache.budget)}), "
        f"{worker.threads} threads on CPUs {sorted(os.sched_getaffinity(0))}, serving {where}, admin 127.0.0.1:{admin_port}"
    )
    stop_wait = asyncio.create_task(stop.wait())
    await asyncio.wait([stop_wait, serving_task, admin_task], return_when=asyncio.FIRST_COMPLETED)
    if not stop.is_set():
        log(f"worker {index}: the HTTP server stopped")
        return 1

    # Drain: stop accepting, answer with Connection: close, exit when the connections are gone.
    worker.draining = True
    sd_notify("STOPPING=1")
    for server in serving.servers:
        server.close()
    deadline = time.monotonic() + DRAIN_SECONDS
    while serving.server_state.connections and time.monotonic() < deadline:
        await asyncio.sleep(0.01)
    serving.should_exit = True
    admin.should_exit = True
    await asyncio.gather(serving_task, admin_task, return_exceptions=True)
    log(f"worker {index}: drained, exiting")
    return 0


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(description="provisioner's model server (one worker, or --check of the registry)")
    parser.add_argument("--config", required=True, help="serving.json, written by the serving role")
    mode = parser.add_mutually_exclusive_group(required=True)
    mode.add_argument("--worker", type=int, metavar="I", help="serve as worker I of the config")
    mode.add_argument("--check", action="store_true", help="load every listed version once and compare the total with the budget")
    args = parser.parse_args(argv)
    try:
        config = load_config(args.config)
        if args.check:
            set_threads(1)
            return check(config)
        if not 0 <= args.worker < len(config["workers"]):
            raise BadInput(f"worker {args.worker} is not in {args.config} (it lists workers 0..{len(config['workers']) - 1})")
        spec = config["workers"][args.worker]
        set_threads(spec["threads"])  # before numpy or any framework starts its thread pools
        set_affinity(spec["cpus"])
        for module, package in (
            ("numpy", "numpy"),
            ("uvicorn", "uvicorn"),
            ("prometheus_client", "prometheus-client"),
        ):
            try:
                __import__(module)
            except ImportError:
                raise BadInput(
                    f"the ML environment lacks {package}, which the server needs: add the mlstack component serving"
                ) from None
        try:
            import uvloop

            loop_factory = uvloop.new_event_loop
        except ImportError:
            loop_factory = None
        with asyncio.Runner(loop_factory=loop_factory) as runner:
            return runner.run(run_worker(config, args.worker, args.config))
    except BadInput as exc:
        print(f"provisioner_serve: {exc}", file=sys.stderr, flush=True)
        return EXIT_BAD


if __name__ == "__main__":
    sys.exit(main())

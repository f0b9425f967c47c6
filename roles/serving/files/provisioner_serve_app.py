"""The model server's worker: its metrics, its byte-budgeted LRU cache of loaded versions, and
the HTTP app (starlette) with its input validation and the unread-body middleware.
"""

from __future__ import annotations

import asyncio
import collections
import contextlib
import json
import os
import time
from collections.abc import Callable
from typing import Any

from provisioner_serve_config import (
    _NUMBERS,
    DISCARD_BYTES,
    DISCARD_SECONDS,
    LATENCY_BUCKETS,
    BadInput,
    ModelError,
    Registry,
    RequestError,
    files_bytes,
)
from provisioner_serve_models import (
    Model,
    _some,
    listed_versions,
    load_model,
    over_budget_message,
    release_memory,
    settle_heap,
)
from provisioner_serve_process import log


class Metrics:
    def __init__(self, worker: int, budget: int) -> None:
        import prometheus_client as prom

        with contextlib.suppress(AttributeError):
            prom.disable_created_metrics()
        self.prom = prom
        self.registry = prom.CollectorRegistry(auto_describe=True)
        w = str(worker)
        reg = self.registry
        self._requests = prom.Counter(
            "provisioner_serving_requests_total",
            "Predict requests by model, version and status code.",
            ["worker", "model", "version", "code"],
            registry=reg,
        )
        self._duration = prom.Histogram(
            "provisioner_serving_request_duration_seconds",
            "Predict request duration, body read to response built.",
            ["worker", "model", "version"],
            buckets=LATENCY_BUCKETS,
            registry=reg,
        )
        self.loaded = prom.Gauge(
            "provisioner_serving_loaded_versions", "Model versions in the cache.", ["worker"], registry=reg
        ).labels(w)
        self.cache = prom.Gauge(
            "provisioner_serving_cache_bytes", "Bytes of the model versions in the cache.", ["worker"], registry=reg
        ).labels(w)
        budget_gauge = prom.Gauge("provisioner_serving_cache_budget_bytes", "The cache's byte budget.", ["worker"], registry=reg)
        budget_gauge.labels(w).set(budget)
        self.evictions = prom.Counter(
            "provisioner_serving_cache_evictions_total",
            "Versions evicted from the cache (least recently used).",
            ["worker"],
            registry=reg,
        ).labels(w)
        self._loads = prom.Counter(
            "provisioner_serving_model_loads_total", "Model version loads by result.", ["worker", "result"], registry=reg
        )
        self._predict = prom.Gauge(
            "provisioner_serving_predict_seconds",
            "A cached version's single-row predict time, measured at its load, by the engine that serves it.",
            ["worker", "model", "version", "engine"],
            registry=reg,
        )
        self.loads_ok = self._loads.labels(w, "ok")
        self.loads_error = self._loads.labels(w, "error")
        self.worker = w
        self._request_children: dict[tuple[str, str, int], Any] = {}
        self._duration_children: dict[tuple[str, str], Any] = {}

    def request(self, model: str, version: str, code: int, seconds: float | None) -> None:
        key = (model, version, code)
        child = self._request_children.get(key)
        if child is None:
            child = self._request_children[key] = self._requests.labels(self.worker, model, version, str(code))
        child.inc()
        if seconds is not None:
            hkey = (model, version)
            hist = self._duration_children.get(hkey)
            if hist is None:
                hist = self._duration_children[hkey] = self._duration.labels(self.worker, model, version)
            hist.observe(seconds)

    def cached(self, model: Model) -> None:
        if model.engine.predict_us is not None:
            self._predict.labels(self.worker, model.name, model.version, model.engine.name).set(model.engine.predict_us / 1e6)

    def uncached(self, model: Model) -> None:
        with contextlib.suppress(KeyError):
            self._predict.remove(self.worker, model.name, model.version, model.engine.name)

    def text(self) -> bytes:
        return self.prom.generate_latest(self.registry)


class Cache:
    """Loaded versions in least-recently-used order, within a byte budget."""

    def __init__(self, budget: int, metrics: Metrics) -> None:
        self.budget = budget
        self.metrics = metrics
        self.entries: collections.OrderedDict[tuple[str, str], Model] = collections.OrderedDict()
        self.bytes = 0

    def get(self, key: tuple[str, str]) -> Model | None:
        model = self.entries.get(key)
        if model is not None:
            self.entries.move_to_end(key)
        return model

    def put(self, model: Model, evict: bool = True) -> list[Model]:
        """Add a version; evict the least recently used others while over budget (never itself)."""
        key = (model.name, model.version)
        old = self.entries.pop(key, None)
        if old is not None:
            self.bytes -= old.bytes
            self.metrics.uncached(old)
        self.entries[key] = model
        self.metrics.cached(model)
        self.bytes += model.bytes
        evicted = []
        while evict and self.bytes > self.budget and len(self.entries) > 1:
            _key, victim = self.entries.popitem(last=False)
            self.bytes -= victim.bytes
            self.metrics.uncached(victim)
            evicted.append(victim)
        if evicted:
            self.metrics.evictions.inc(len(evicted))
        self.metrics.loaded.set(len(self.entries))
        self.metrics.cache.set(self.bytes)
        return evicted


class Worker:
    def __init__(self, config: dict[str, Any], index: int, config_path: str) -> None:
        self.config = config
        self.index = index
        self.config_path = config_path
        spec = config["workers"][index]
        self.threads: int = spec["threads"]
        self.registry = Registry(config["registry"])
        self.max_body: int = config["max_body_bytes"]
        self.max_rows: int = config["max_batch_rows"]
        self.metrics = Metrics(index, config["cache_budget_bytes"])
        self.cache = Cache(config["cache_budget_bytes"], self.metrics)
        self.listed: set[tuple[str, str]] = set()
        self.ready = False
        self.draining = False
        self._locks: dict[tuple[str, str], asyncio.Lock] = {}
        self._close_headers = {"connection": "close"}
        import numpy

        self.np = numpy

    # -- loading

    def load_listed(self) -> list[Model]:
        """Load every listed version (in a thread, before the worker is ready)."""
        wanted = listed_versions(self.config, self.registry)
        for name, version in wanted:
            if not self.registry.has(name, version):
                raise BadInput(
                    f"listed version {name}/{version} is not in the registry "
                    f"({self.registry.root / name / version}/metadata.json missing)"
                )
        models = []
        for name, version in wanted:
            try:
                models.append(load_model(self.registry, name, version, self.threads, self.config["engines"]))
            except ModelError as exc:
                self.metrics.loads_error.inc()
                raise BadInput(str(exc)) from None
            self.metrics.loads_ok.inc()
        self.listed = set(wanted)
        return models

    def start_models(self, models: list[Model]) -> None:
        """Warm the loaded versions on the serving thread and put them in the cache."""
        for model in models:
            model.warm(self.config["warmup_requests"])
            self.cache.put(model, evict=False)
        if self.cache.bytes > self.cache.budget:
            log(f"worker {self.index}: warning: {over_budget_message(models, self.cache.budget)}")
        settle_heap()

    async def resolve(self, name: str, version: str) -> Model:
        if version == "latest":
            found = self.registry.latest(name)
            if found is None:
                raise RequestError(404, f"no model {name!r} in the registry")
            version = found
        key = (name, version)
        model = self.cache.get(key)
        if model is not None:
            return model
        if not self.registry.has(name, version):
            raise RequestError(404, f"no model version {name}/{version} in the registry")
        lock = self._locks.setdefault(key, asyncio.Lock())
        async with lock:
            model = self.cache.get(key)
            if model is not None:
                return model
            try:
                model = await asyncio.to_thread(load_model, self.registry, name, version, self.threads, self.config["engines"])
                model.warm(self.config["warmup_requests"])
            except ModelError as exc:
                self.metrics.loads_error.inc()
                log(f"worker {self.index}: {exc}")
                raise RequestError(500, f"model version {name}/{version} cannot be loaded: {exc}") from None
            self.metrics.loads_ok.inc()
            evicted = self.cache.put(model)
            if evicted:
                log(
                    f"worker {self.index}: evicted {', '.join(f'{m.name}/{m.version}' for m in evicted)} to load {name}/{version}"
                )
                del evicted
                release_memory()
            settle_heap()
        self._locks.pop(key, None)
        return model

    # -- HTTP

    def response(self, status: int, doc: Any) -> Any:
        from starlette.responses import Response

        return Response(
            json.dumps(doc, separators=(",", ":")),
            status,
            headers=self._close_headers if self.draining else None,
            media_type="application/json",
        )

    async def body(self, request: Any) -> bytes:
        length = request.headers.get("content-length")
        if length is not None:
            try:
                size = int(length)
            except ValueError:
                raise RequestError(400, f"Content-Length {length!r} is not a number") from None
            if size > self.max_body:
                raise RequestError(413, f"body of {size} bytes is above max_body_bytes {self.max_body}")
            return await request.body()
        chunks = []
        total = 0
        async for chunk in request.stream():
            total += len(chunk)
            if total > self.max_body:
                raise RequestError(413, f"body above max_body_bytes {self.max_body}")
            chunks.append(chunk)
        return b"".join(chunks)

    async def document(self, request: Any) -> Any:
        raw = await self.body(request)
        try:
            return json.loads(raw, parse_constant=_no_constant)
        except ValueError as exc:
            raise RequestError(400, f"malformed JSON body: {exc}") from None

    async def predict(self, request: Any) -> Any:
        return await self._predict(request, batch=False)

    async def predict_batch(self, request: Any) -> Any:
        return await self._predict(request, batch=True)

    async def _predict(self, request: Any, batch: bool) -> Any:
        start = time.perf_counter()
        params = request.path_params
        name, version = params["name"], params["version"]
        label_model = label_version = ""
        try:
            model = await self.resolve(name, version)
            label_model, label_version = model.name, model.version
            doc = await self.document(request)
            if batch:
                rows = self.batch_rows(model, doc)
                result = {"model": model.name, "version": model.version, "predictions": model.predict(model.array(rows))}
            else:
                features = doc.get("features") if type(doc) is dict else None
                if type(features) is not dict or len(doc) != 1:
                    raise RequestError(422, 'the body must be {"features": {"name": number, ...}}')
                row = model.values(features)
                result = {"model": model.name, "version": model.version, "prediction": model.predict(model.array([row]))[0]}
            code = 200
        except RequestError as exc:
            code = exc.status
            result = {"error": str(exc)}
        except Exception as exc:  # a framework error on this input: the worker keeps serving
            code = 500
            result = {"error": f"prediction failed: {type(exc).__name__}: {str(exc).strip()[:300]}"}
        response = self.response(code, result)
        self.metrics.request(label_model, label_version, code, time.perf_counter() - start if label_model else None)
        return response

    def batch_rows(self, model: Model, doc: Any) -> list[list[Any]]:
        rows = doc.get("rows") if type(doc) is dict else None
        if type(rows) is not list or len(doc) != 1:
            raise RequestError(
                422, 'the body must be {"rows": [[numbers in feature order], ...]} or {"rows": [{"name": number}, ...]}'
            )
        if not rows:
            raise RequestError(422, "rows is empty")
        if len(rows) > self.max_rows:
            raise RequestError(413, f"{len(rows)} rows are above max_batch_rows {self.max_rows}")
        first = type(rows[0])
        if first is dict:
            out = []
            for i, row in enumerate(rows):
                if type(row) is not dict:
                    raise RequestError(422, f"row {i}: every row must be an object like row 0")
                out.append(model.values(row, f"row {i}: "))
            return out
        if first is not list:
            raise RequestError(422, "rows must be lists of numbers in feature order or objects by feature name")
        n = model.n
        for i, row in enumerate(rows):
            if type(row) is not list or len(row) != n:
                got = f"{len(row)} values" if type(row) is list else type(row).__name__
                raise RequestError(
                    422,
                    f"row {i}: {got}, but {model.name}/{model.version} takes {n} features in order: {_some(model.features, 5)}",
                )
            if not _NUMBERS.issuperset(map(type, row)):
                bad = [f"{model.features[j]}={v!r}" for j, v in enumerate(row) if type(v) not in _NUMBERS]
                raise RequestError(422, f"row {i}: non-numeric features: {_some(bad)} (numbers only)")
        return rows

    async def healthz(self, request: Any) -> Any:
        return self.response(200, {"status": "ok", "worker": self.index})

    async def readyz(self, request: Any) -> Any:
        if self.ready and not self.draining:
            return self.response(200, {"status": "ready", "worker": self.index})
        return self.response(503, {"status": "draining" if self.draining else "loading", "worker": self.index})

    async def models(self, request: Any) -> Any:
        return self.response(200, self.models_doc())

    def models_doc(self) -> dict[str, Any]:
        entries = []
        seen = set()
        for name, version in self.registry.all_versions():
            seen.add((name, version))
            loaded = self.cache.entries.get((name, version))
            entry: dict[str, Any] = {"name": name, "version": version}
            if loaded is not None:
                entry.update(framework=loaded.framework, features=loaded.n, loaded=True, bytes=loaded.bytes)
                entry.update(loaded.engine.to_dict())
            else:
                try:
                    meta = self.registry.metadata(name, version)
                    entry.update(framework=meta.framework, features=len(meta.features))
                except ModelError as exc:
                    entry.update(framework=None, features=0, error=str(exc))
                entry.update(loaded=False, bytes=files_bytes(self.registry.root / name / version))
            entry["listed"] = (name, version) in self.listed
            entries.append(entry)
        for (name, version), loaded in self.cache.entries.items():
            if (name, version) not in seen:  # removed from disk, still served from the cache
                entries.append(
                    {
                        "name": name,
                        "version": version,
                        "framework": loaded.framework,
                        "features": loaded.n,
                        "loaded": True,
                        "bytes": loaded.bytes,
                        "listed": (name, version) in self.listed,
                        **loaded.engine.to_dict(),
                    }
                )
        return {
            "worker": self.index,
            "threads": self.threads,
            "cpus": sorted(os.sched_getaffinity(0)),
            "cache_budget_bytes": self.cache.budget,
            "cache_bytes": self.cache.bytes,
            "models": entries,
        }

    async def metrics_endpoint(self, request: Any) -> Any:
        from starlette.responses import Response

        return Response(
            self.metrics.text(),
            200,
            headers=self._close_headers if self.draining else None,
            media_type=self.metrics.prom.CONTENT_TYPE_LATEST,
        )

    async def not_found(self, request: Any, exc: Any) -> Any:
        status = getattr(exc, "status_code", 404)
        return self.response(status, {"error": f"{request.method} {request.url.path}: {getattr(exc, 'detail', 'not found')}"})

    def app(self) -> Any:
        from starlette.applications import Starlette
        from starlette.routing import Route

        app = Starlette(
            routes=[
                Route("/v1/models/{name}/{version}/predict", self.predict, methods=["POST"]),
                Route("/v1/models/{name}/{version}/predict/batch", self.predict_batch, methods=["POST"]),
                Route("/healthz", self.healthz, methods=["GET"]),
                Route("/readyz", self.readyz, methods=["GET"]),
                Route("/v1/models", self.models, methods=["GET"]),
                Route("/metrics", self.metrics_endpoint, methods=["GET"]),
            ],
            exception_handlers={404: self.not_found, 405: self.not_found},
        )
        return DiscardUnreadBody(app, max(DISCARD_BYTES, self.max_body))


class DiscardUnreadBody:
    """ASGI middleware: before a response starts, the request body the app left unread is read
    and thrown away (up to `limit` bytes and DISCARD_SECONDS), so a client that sends its whole
    body before reading (no `Expect: 100-continue`: urllib, requests) gets the response instead
    of a connection reset. A client that asked for 100 Continue and was not told to send gets
    the response at once with `Connection: close`, as does a body larger than the limit."""

    def __init__(self, app: Any, limit: int) -> None:
        self.app = app
        self.limit = limit

    async def __call__(self, scope: dict[str, Any], receive: Callable[[], Any], send: Callable[[Any], Any]) -> None:
        if scope["type"] != "http":
            await self.app(scope, receive, send)
            return
        headers = dict(scope.get("headers") or [])
        length = headers.get(b"content-length")
        try:
            declared = int(length) if length is not None else None
        except ValueError:
            declared = None
        chunked = b"chunked" in headers.get(b"transfer-encoding", b"").lower()
        state = {
            "unread": chunked or bool(declared),  # a body the app has not read to its end
            "asked": False,  # the app called receive (so the server sent 100 Continue, if asked for)
        }
        expects = headers.get(b"expect", b"").lower() == b"100-continue"

        async def tracked_receive() -> Any:
            state["asked"] = True
            message = await receive()
            if message["type"] != "http.request" or not message.get("more_body", False):
                state["unread"] = False
            return message

        async def discarding_send(message: Any) -> None:
            if message["type"] == "http.response.start" and state["unread"]:
                state["unread"] = False
                if not await self.discard(receive, declared, expects and not state["asked"]):
                    message = {**message, "headers": [*message.get("headers", []), (b"connection", b"close")]}
            await send(message)

        await self.app(scope, tracked_receive, discarding_send)

    async def discard(self, receive: Callable[[], Any], declared: int | None, not_sent: bool) -> bool:
        """True when the rest of the body was read (the connection stays usable)."""
        if not_sent or (declared is not None and declared > self.limit):
            return False
        read = 0
        try:
            async with asyncio.timeout(DISCARD_SECONDS):
                while True:
                    message = await receive()
                    if message["type"] != "http.request":
                        return False  # the client went away
                    read += len(message.get("body", b""))
                    if not message.get("more_body", False):
                        return True
                    if read > self.limit:
                        return False
        except TimeoutError:
            return False


def _no_constant(name: str) -> None:
    raise ValueError(f"{name} is not JSON")

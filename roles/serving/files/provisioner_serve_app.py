"""The model server's worker: its metrics, its byte-budgeted LRU cache of loaded versions, and
the HTTP app: a plain ASGI callable that uvicorn runs, with its routes, input validation and the
handling of a body it leaves unread.
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
    BATCH_BODY_SECONDS,
    DISCARD_BYTES,
    DISCARD_SECONDS,
    LATENCY_BUCKETS,
    NPY,
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
        self.max_batch: int = config["max_batch_bytes"]
        self._batch_turn = asyncio.Semaphore(1)  # one .npy batch body in memory at a time
        self.metrics = Metrics(index, config["cache_budget_bytes"])
        self.cache = Cache(config["cache_budget_bytes"], self.metrics)
        self.listed: set[tuple[str, str]] = set()
        self.ready = False
        self.draining = False
        self._locks: dict[tuple[str, str], asyncio.Lock] = {}
        self.discard_limit = max(DISCARD_BYTES, self.max_body, self.max_batch)
        self._gets: dict[str, Callable[[], tuple[int, Any]]] = {
            "/healthz": self.healthz,
            "/readyz": self.readyz,
            "/v1/models": self.models,
            "/metrics": self.metrics_text,
        }
        self._metrics_type = (b"content-type", self.metrics.prom.CONTENT_TYPE_LATEST.encode())
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

    # -- HTTP: a plain ASGI callable (uvicorn runs it); no framework between the socket and predict

    async def __call__(self, scope: dict[str, Any], receive: Callable[[], Any], send: Callable[[Any], Any]) -> None:
        if scope["type"] != "http":
            if scope["type"] == "websocket":
                await send({"type": "websocket.close", "code": 1003})
            return
        exchange = Exchange(scope, receive)
        method = scope["method"]
        path = scope["path"]
        if len(path) > 1 and path[-1] == "/":
            path = path[:-1]  # /healthz/ is /healthz (starlette redirected it)
        ctype = _JSON
        if path.startswith("/v1/models/"):
            parts = path[11:].split("/")
            kind = (len(parts) == 3 and parts[2] == "predict") or (len(parts) == 4 and parts[2:] == ["predict", "batch"])
            if not (kind and parts[0] and parts[1]):
                code, payload = self.not_routed(method, path, 404)
            elif method != "POST":
                code, payload = self.not_routed(method, path, 405)
            elif exchange.ctype == NPY and len(parts) == 3:
                code, payload = 415, {"error": f"a .npy body goes to {path}/batch; this route takes one JSON row"}
            else:
                answer = self.one_row if len(parts) == 3 else self.npy_batch if exchange.ctype == NPY else self.json_batch
                code, payload, ctype = await self.predict(exchange, parts[0], parts[1], answer)
        else:
            handler = self._gets.get(path)
            if handler is None:
                code, payload = self.not_routed(method, path, 404)
            elif method not in ("GET", "HEAD"):
                code, payload = self.not_routed(method, path, 405)
            else:
                code, payload = handler()
                if path == "/metrics":
                    ctype = self._metrics_type
        if type(payload) is not bytes:
            payload = dumps(payload)
        headers = [ctype, (b"content-length", str(len(payload)).encode())]
        # the body read to its end (never after a stalled one: the connection closes)
        kept = not exchange.unread or (not exchange.stalled and await exchange.discard(self.discard_limit))
        if self.draining or not kept:
            headers.append(_CLOSE)
        if code == 405:
            headers.append((b"allow", b"POST" if path.startswith("/v1/models/") else b"GET, HEAD"))
        await send({"type": "http.response.start", "status": code, "headers": headers})
        await send({"type": "http.response.body", "body": payload})

    def not_routed(self, method: str, path: str, code: int) -> tuple[int, Any]:
        return code, {"error": f"{method} {path}: {'Not Found' if code == 404 else 'Method Not Allowed'}"}

    async def document(self, exchange: Exchange) -> Any:
        raw = await exchange.body(self.max_body, "max_body_bytes")
        try:
            return loads(raw)
        except ValueError as exc:
            raise RequestError(400, f"malformed JSON body: {exc}") from None
        except RecursionError:
            raise RequestError(400, "malformed JSON body: nested too deeply") from None

    async def predict(
        self, exchange: Exchange, name: str, version: str, answer: Callable[[Exchange, Model], Any]
    ) -> tuple[int, bytes, tuple[bytes, bytes]]:
        """The version resolved, ANSWER's (payload, content type) for it, or the error; counted either way."""
        start = time.perf_counter()
        label_model = label_version = ""
        try:
            model = await self.resolve(name, version)
            label_model, label_version = model.name, model.version
            payload, ctype = await answer(exchange, model)
            code = 200
        except RequestError as exc:
            code, payload, ctype = exc.status, dumps({"error": str(exc)}), _JSON
        except Exception as exc:  # a framework error on this input: the worker keeps serving
            code, ctype = 500, _JSON
            payload = dumps({"error": f"prediction failed: {type(exc).__name__}: {str(exc).strip()[:300]}"})
        self.metrics.request(label_model, label_version, code, time.perf_counter() - start if label_model else None)
        return code, payload, ctype

    async def one_row(self, exchange: Exchange, model: Model) -> tuple[bytes, tuple[bytes, bytes]]:
        doc = await self.document(exchange)
        features = doc.get("features") if type(doc) is dict else None
        if type(features) is not dict or len(doc) != 1:
            raise RequestError(422, 'the body must be {"features": {"name": number, ...}}')
        prediction = model.predict(model.array([model.values(features)]))[0]
        return dumps({"model": model.name, "version": model.version, "prediction": prediction}), _JSON

    async def json_batch(self, exchange: Exchange, model: Model) -> tuple[bytes, tuple[bytes, bytes]]:
        rows = self.batch_rows(model, await self.document(exchange))
        return dumps({"model": model.name, "version": model.version, "predictions": model.predict(model.array(rows))}), _JSON

    async def npy_batch(self, exchange: Exchange, model: Model) -> tuple[bytes, tuple[bytes, bytes]]:
        """.npy rows (up to max_batch_bytes, one body at a time per worker): the answer is .npy when the
        client accepts it, else the JSON of the other batch requests."""
        async with self._batch_turn:
            raw = await exchange.body(self.max_batch, "max_batch_bytes", BATCH_BODY_SECONDS)
            rows = model.npy_rows(raw, self.max_rows, self.max_batch)
            del raw
            out = model.predict_array(rows)
            del rows
        if not exchange.accepts_npy:
            return dumps({"model": model.name, "version": model.version, "predictions": out.tolist()}), _JSON
        import io

        buffer = io.BytesIO()
        self.np.lib.format.write_array(buffer, out, allow_pickle=False)
        return buffer.getvalue(), _NPY_TYPE

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

    def healthz(self) -> tuple[int, Any]:
        return 200, {"status": "ok", "worker": self.index}

    def readyz(self) -> tuple[int, Any]:
        if self.ready and not self.draining:
            return 200, {"status": "ready", "worker": self.index}
        return 503, {"status": "draining" if self.draining else "loading", "worker": self.index}

    def models(self) -> tuple[int, Any]:
        return 200, self.models_doc()

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

    def metrics_text(self) -> tuple[int, Any]:  # sent with Prometheus' content type
        return 200, self.metrics.text()

    def app(self) -> Worker:
        """The ASGI app: the worker itself."""
        return self


_JSON = (b"content-type", b"application/json")
_NPY_TYPE = (b"content-type", NPY)
_CLOSE = (b"connection", b"close")


class Exchange:
    """One request's body as the app reads it. A body the app leaves unread (a request refused
    before its body is looked at) is read and thrown away before the response starts, up to a
    limit and DISCARD_SECONDS, so a client that sends its whole body before reading (no
    `Expect: 100-continue`: urllib, requests) gets the response instead of a connection reset.
    A client that asked for 100 Continue and was not told to send gets the response at once with
    `Connection: close`, as does a body larger than the limit."""

    __slots__ = ("accepts_npy", "asked", "ctype", "declared", "expects", "receive", "stalled", "unread")

    def __init__(self, scope: dict[str, Any], receive: Callable[[], Any]) -> None:
        self.receive = receive
        self.declared: int | None = None
        self.expects = False
        self.ctype = b""
        self.accepts_npy = False
        chunked = False
        for key, value in scope["headers"]:
            if key == b"content-length":
                try:
                    self.declared = int(value)
                except ValueError:
                    self.declared = -1
            elif key == b"transfer-encoding":
                chunked = b"chunked" in value.lower()
            elif key == b"expect":
                self.expects = value.lower() == b"100-continue"
            elif key == b"content-type":
                self.ctype = value.split(b";", 1)[0].strip().lower()
            elif key == b"accept":
                self.accepts_npy = _accepts(value, NPY)
        self.unread = chunked or bool(self.declared)  # a body not read to its end
        self.asked = False  # receive was called (so the server sent 100 Continue, if asked for)
        self.stalled = False  # the body did not arrive in time: the connection closes

    async def message(self) -> Any:
        self.asked = True
        message = await self.receive()
        if message["type"] != "http.request" or not message.get("more_body", False):
            self.unread = False
        return message

    async def body(self, limit: int, option: str, seconds: float | None = None) -> bytes | bytearray:
        """The whole body, up to LIMIT bytes (413 naming OPTION) and, with SECONDS, that long (408).
        A body of a declared length is read into one buffer of that length (no second copy)."""
        declared = self.declared
        if declared is not None:
            if declared < 0:
                raise RequestError(400, "Content-Length is not a number")
            if declared > limit:
                raise RequestError(413, f"body of {declared} bytes is above {option} {limit}")
        if seconds is not None and declared:
            seconds = max(seconds, declared / (1 << 20))  # and at least 1 MiB/s for a large body
        try:
            async with asyncio.timeout(seconds):
                # one buffer of the declared length only for a timed body (a batch, one at a time):
                # an untimed one grows as it arrives, so a slow client holds no more than it sent
                return await (self._sized(declared) if declared and seconds is not None else self._chunks(limit, option))
        except TimeoutError:
            self.stalled = True
            raise RequestError(408, f"the body did not arrive within {seconds:.0f} s") from None

    async def _sized(self, declared: int) -> bytes | bytearray:
        message: Any = await self.message()
        if message["type"] == "http.request" and not message.get("more_body", False):
            whole: bytes = message.get("body", b"")  # in one piece, as a small body comes
            if len(whole) != declared:
                raise RequestError(400, f"the body has {len(whole)} bytes, its Content-Length {declared}")
            return whole
        buffer = bytearray(declared)
        view = memoryview(buffer)
        filled = 0
        while True:
            if message is None:
                message = await self.message()
            if message["type"] != "http.request":
                raise RequestError(400, "the client went away before its body ended")
            chunk = message.get("body", b"")
            if filled + len(chunk) > declared:
                raise RequestError(400, f"the body is longer than its Content-Length {declared}")
            view[filled : filled + len(chunk)] = chunk
            filled += len(chunk)
            if not message.get("more_body", False):
                if filled != declared:
                    raise RequestError(400, f"the body ended at {filled} of its Content-Length {declared} bytes")
                return buffer
            message = None

    async def _chunks(self, limit: int, option: str) -> bytes:
        chunks = []
        total = 0
        while True:
            message = await self.message()
            if message["type"] != "http.request":
                raise RequestError(400, "the client went away before its body ended")
            chunk = message.get("body", b"")
            total += len(chunk)
            if total > limit:
                raise RequestError(413, f"body above {option} {limit}")
            chunks.append(chunk)
            if not message.get("more_body", False):
                return chunks[0] if len(chunks) == 1 else b"".join(chunks)

    async def discard(self, limit: int) -> bool:
        """Read the rest of the body; True when it was read to its end (the connection stays usable)."""
        self.unread = False
        if (self.expects and not self.asked) or (self.declared is not None and self.declared > limit):
            return False
        read = 0
        try:
            async with asyncio.timeout(DISCARD_SECONDS):
                while True:
                    message = await self.receive()
                    if message["type"] != "http.request":
                        return False  # the client went away
                    read += len(message.get("body", b""))
                    if not message.get("more_body", False):
                        return True
                    if read > limit:
                        return False
        except TimeoutError:
            return False


def _accepts(header: bytes, media: bytes) -> bool:
    """Whether an Accept header lists MEDIA with a weight above 0."""
    for part in header.lower().split(b","):
        kind, _, params = part.partition(b";")
        if kind.strip() != media:
            continue
        for param in params.split(b";"):
            name, _, value = param.partition(b"=")
            if name.strip() == b"q":
                try:
                    return float(value) > 0
                except ValueError:
                    return False
        return True
    return False


def _no_constant(name: str) -> None:
    raise ValueError(f"{name} is not JSON")


def _stdlib_loads(raw: bytes | bytearray) -> Any:
    return json.loads(raw, parse_constant=_no_constant)


def _stdlib_dumps(doc: Any) -> bytes:
    return json.dumps(doc, separators=(",", ":")).encode()


try:  # the serving component's orjson: a quarter more requests/s than the standard library's json
    import orjson

    def loads(raw: bytes | bytearray) -> Any:
        """A body's JSON; NaN and Infinity are not JSON. What orjson refuses is read again by the
        standard library, for its message (or for what it accepts that orjson does not: a number
        beyond the float range, a lone surrogate in a string)."""
        try:
            return orjson.loads(raw)
        except orjson.JSONDecodeError:
            return _stdlib_loads(raw)

    def dumps(doc: Any) -> bytes:
        """Compact, as the standard library's with its separators; NaN as null. A string orjson cannot
        write (a lone surrogate the standard library read, echoed in a 422) goes through the standard library."""
        try:
            return orjson.dumps(doc)
        except TypeError:
            return _stdlib_dumps(doc)

except ImportError:  # an environment installed from an older lock
    loads, dumps = _stdlib_loads, _stdlib_dumps

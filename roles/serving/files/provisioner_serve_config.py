"""The model server's constants, errors, configuration (serving.json) and registry
(REGISTRY/NAME/VERSION/metadata.json): what every other part of provisioner_serve.py reads.
"""

from __future__ import annotations

import contextlib
import json
import os
import re
from pathlib import Path
from typing import Any

from provisioner_serve_engines import KNOWN as ENGINES  # the engines the role's option lists

EXIT_BAD = 2
NAME_RE = re.compile(r"[A-Za-z0-9][A-Za-z0-9._-]{0,63}\Z")
TASKS = ("regression", "classification")
# framework -> (the module it needs, the mlstack component that installs it)
FRAMEWORKS = {
    "xgboost": ("xgboost", "gbdt"),
    "lightgbm": ("lightgbm", "gbdt"),
    "catboost": ("catboost", "gbdt"),
    "sklearn": ("joblib", "core"),
    "torchscript": ("torch", "torch"),
}
THREAD_VARS = (
    "OMP_NUM_THREADS",
    "MKL_NUM_THREADS",
    "OPENBLAS_NUM_THREADS",
    "NUMEXPR_NUM_THREADS",
    "VECLIB_MAXIMUM_THREADS",
    "BLIS_NUM_THREADS",
)
# Seconds a draining worker keeps answering (with Connection: close) on its open
# connections; it exits sooner once every serving connection is closed.
DRAIN_SECONDS = 3.0
BACKLOG = 2048
LATENCY_BUCKETS = (0.0005, 0.001, 0.0025, 0.005, 0.01, 0.025, 0.05, 0.1, 0.25, 0.5, 1.0)
SD_LISTEN_FDS_START = 3
# A response sent before the request body was read (a 413 for its size, a 404 for its model)
# leaves the body in the socket; closing over unread data makes the kernel answer with a reset
# that can reach the client before the response does (RFC 9112, 9.6). So the rest of the body
# is read and thrown away first, as nginx's lingering close does for 30 s, up to this many
# bytes (or max_body_bytes, when larger) and this many seconds; beyond either the response goes
# at once with Connection: close.
DISCARD_BYTES = 64 << 20
DISCARD_SECONDS = 30.0
_NUMBERS = frozenset((int, float))
MAX_BATCH_BYTES = 64 << 20
# A .npy batch body must arrive within this many seconds, or a second per MiB when it is larger (it
# holds the worker's one batch turn): else 408 and Connection: close, so a stalled upload never
# blocks the batches behind it.
BATCH_BODY_SECONDS = 30.0
NPY = b"application/x-npy"  # a batch as NumPy's .npy (rows x features), and its answer when accepted


class BadInput(Exception):
    """A config or registry problem: one line naming it and the fix, exit 2."""


class ModelError(Exception):
    """A model version that cannot be loaded (the message names the file)."""


class RequestError(Exception):
    """A request the worker refuses with a 4xx; the worker keeps serving."""

    def __init__(self, status: int, message: str) -> None:
        super().__init__(message)
        self.status = status


# ---------------------------------------------------------------------------------------
# Config


def _int(doc: dict[str, Any], key: str, where: str, minimum: int = 0, maximum: int | None = None) -> int:
    value = doc.get(key)
    if type(value) is not int or value < minimum or (maximum is not None and value > maximum):
        bound = f"{minimum}..{maximum}" if maximum is not None else f">= {minimum}"
        raise BadInput(f"{where}: {key} must be an integer {bound}, not {value!r}; fix it in the serving role's options")
    return value


def json_object(path: str | Path, what: str, error: type[Exception], hint: str = "") -> dict[str, Any]:
    """The JSON object in PATH; a file that cannot be read, is not JSON or holds no object raises
    ERROR naming PATH and WHAT (HINT, where given, says what writes the file)."""
    try:
        doc = json.loads(Path(path).read_text(encoding="utf-8"))
    except OSError as exc:
        raise error(f"{path}: cannot read the {what} ({exc.strerror}){hint}") from None
    except ValueError as exc:
        raise error(f"{path}: the {what} is not valid JSON ({exc}){hint}") from None
    if not isinstance(doc, dict):
        raise error(f"{path}: the {what} must be a JSON object{hint}")
    return doc


def load_config(path: str) -> dict[str, Any]:
    """Read and check serving.json; every problem is one line naming the key."""
    doc = json_object(path, "serving config", BadInput, "; the serving role writes it")
    if doc.get("schema") != 1:
        raise BadInput(
            f"{path}: schema {doc.get('schema')!r} is not 1, the one this server reads; update the server with the role"
        )
    for key in ("registry", "listen"):
        if not isinstance(doc.get(key), str) or not doc[key]:
            raise BadInput(f"{path}: {key} must be a non-empty string")
    _int(doc, "port", path, 0, 65535)
    _int(doc, "admin_port_base", path, 1, 65535)
    _int(doc, "cache_budget_bytes", path, 1)
    _int(doc, "max_body_bytes", path, 1)
    _int(doc, "max_batch_rows", path, 1)
    # The largest .npy batch body; a config written before binary batches allows 64 MiB.
    doc.setdefault("max_batch_bytes", MAX_BATCH_BYTES)
    _int(doc, "max_batch_bytes", path, 1)
    _int(doc, "warmup_requests", path, 0)
    # The predictor engines that may take a tree ensemble over (provisioner_serve_engines);
    # a config written before they existed allows every one.
    allowed = doc.setdefault("engines", list(ENGINES))
    if not isinstance(allowed, list) or not all(isinstance(e, str) and e in ENGINES for e in allowed):
        raise BadInput(
            f"{path}: engines must be a list of {', '.join(ENGINES)} (or [] for the frameworks' own predict), not {allowed!r}"
        )
    workers = doc.get("workers")
    if not isinstance(workers, list) or not workers:
        raise BadInput(f"{path}: workers must be a non-empty list of {{index, cpus, threads}}")
    for position, worker in enumerate(workers):
        where = f"{path}: workers[{position}]"
        if not isinstance(worker, dict):
            raise BadInput(f"{where} must be an object {{index, cpus, threads}}")
        if _int(worker, "index", where, 0) != position:
            raise BadInput(f"{where}: index {worker['index']} must equal its position {position}")
        _int(worker, "threads", where, 1)
        cpus = worker.get("cpus")
        if not isinstance(cpus, list) or not cpus or not all(type(c) is int and c >= 0 for c in cpus):
            raise BadInput(f"{where}: cpus must be a non-empty list of CPU numbers, not {cpus!r}")
        if _int(doc, "admin_port_base", path) + position > 65535:
            raise BadInput(f"{path}: admin_port_base + {position} is above 65535")
    models = doc.get("models")
    if models != "all":
        if not isinstance(models, list):
            raise BadInput(f'{path}: models must be "all" or a list of {{name, version}}, not {models!r}')
        for entry in models:
            if not isinstance(entry, dict) or not all(
                isinstance(entry.get(k), str) and NAME_RE.match(entry[k]) for k in ("name", "version")
            ):
                raise BadInput(f"{path}: models entry {entry!r} needs a name and a version of [A-Za-z0-9][A-Za-z0-9._-]{{0,63}}")
    return doc


# ---------------------------------------------------------------------------------------
# Registry


class Metadata:
    __slots__ = ("dir", "features", "file", "framework", "name", "task", "version")

    def __init__(self, name: str, version: str, directory: Path, doc: dict[str, Any]) -> None:
        self.name = name
        self.version = version
        self.dir = directory
        self.framework: str = doc["framework"]
        self.file: Path = directory / doc["file"]
        self.features: list[str] = doc["features"]
        self.task: str = doc.get("task", "regression")


def _version_key(version: str) -> tuple[int, str]:
    return (int(version), "") if version.isdigit() else (0, version)


class Registry:
    """REGISTRY/NAME/VERSION/metadata.json, read from disk on every question (it is the truth)."""

    def __init__(self, root: str) -> None:
        self.root = Path(root)

    def versions(self, name: str) -> list[str]:
        """The versions of NAME present (with a metadata.json), lowest first."""
        if not NAME_RE.match(name):
            return []
        try:
            entries = os.listdir(self.root / name)
        except OSError:
            return []
        found = [v for v in entries if NAME_RE.match(v) and os.path.isfile(self.root / name / v / "metadata.json")]
        if all(v.isdigit() for v in found):
            return sorted(found, key=int)
        return sorted(found)

    def latest(self, name: str) -> str | None:
        found = self.versions(name)
        return found[-1] if found else None

    def names(self) -> list[str]:
        try:
            return sorted(n for n in os.listdir(self.root) if NAME_RE.match(n) and os.path.isdir(self.root / n))
        except OSError:
            return []

    def all_versions(self) -> list[tuple[str, str]]:
        return [(name, version) for name in self.names() for version in self.versions(name)]

    def has(self, name: str, version: str) -> bool:
        return bool(NAME_RE.match(name) and NAME_RE.match(version)) and os.path.isfile(
            self.root / name / version / "metadata.json"
        )

    def metadata(self, name: str, version: str) -> Metadata:
        directory = self.root / name / version
        path = directory / "metadata.json"
        doc = json_object(path, "model metadata", ModelError)
        framework = doc.get("framework")
        if framework not in FRAMEWORKS:
            raise ModelError(f"{path}: framework {framework!r} is not one of {', '.join(FRAMEWORKS)}")
        file = doc.get("file")
        if not isinstance(file, str) or not file or os.path.isabs(file) or ".." in Path(file).parts:
            raise ModelError(f"{path}: file must name the model file relative to {directory}, not {file!r}")
        features = doc.get("features")
        if (
            not isinstance(features, list)
            or not features
            or not all(isinstance(f, str) and f for f in features)
            or len(set(features)) != len(features)
        ):
            raise ModelError(f"{path}: features must be a non-empty list of distinct feature names")
        if doc.get("task", "regression") not in TASKS:
            raise ModelError(f"{path}: task {doc.get('task')!r} is not one of {', '.join(TASKS)}")
        return Metadata(name, version, directory, doc)


def files_bytes(directory: Path) -> int:
    """The size on disk of every file of a version."""
    total = 0
    for base, _dirs, files in os.walk(directory):
        for file in files:
            with contextlib.suppress(OSError):
                total += os.stat(os.path.join(base, file)).st_size
    return total

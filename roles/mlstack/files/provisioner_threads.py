"""Each joblib/loky worker gets its share of the machine's thread settings, with no change to a
user's code.  Loaded at interpreter start by provisioner_threads.pth in the ML environment
(role mlstack); inert unless the environment carries PROVISIONER_THREADS (role thread_env).

Why: joblib's loky backend gives each worker cpu_count() // n_jobs BLAS/OpenMP threads only for
a variable that is not in the environment already; one that is passes into every worker as it
is (joblib/_parallel_backends.py, ParallelBackendBase._prepare_worker_env: ``os.environ.get(var,
default_n_threads)``).  Role thread_env exports OMP_NUM_THREADS and its kin = the plan's threads
of one job, so a plain ``GridSearchCV(..., n_jobs=N)`` ran N workers with every core each.

What: when joblib starts worker processes, every variable whose value is still the one
provisioner gave this process (PROVISIONER_THREADS = that count, exported next to the
variables) gets the workers' share instead: PROVISIONER_THREADS // n_jobs, at least 1 - what
``ml-env --trials N`` gives each of N processes.  The other counts of the thread settings
(`scaled` in threads.conf: Arrow's IO pool, the inter-op pools, DataLoader workers) get the same
share of theirs, as ml-env does.  A value the user set themselves (it differs from
PROVISIONER_THREADS), joblib's ``inner_max_num_threads``, and a process without
PROVISIONER_THREADS (``unset PROVISIONER_THREADS`` turns this off) keep joblib's own behaviour.
A single process (no workers) is never touched: it keeps the plan's threads.

Cost at start-up: one environment look-up; joblib is patched only when it is imported.
"""

from __future__ import annotations

import contextlib  # typing imports it anyway: no start-up cost of its own
import os
import sys
from typing import TYPE_CHECKING, cast

if TYPE_CHECKING:
    from collections.abc import Mapping
    from importlib.abc import Loader

MARKER = "PROVISIONER_THREADS"
SETTINGS_FILE = "/etc/provisioner/threads.conf"
TARGET = "joblib._parallel_backends"
# Role thread_env's default thread variables, for a host whose threads.conf cannot be read.
DEFAULT_VARIABLES = (
    "OMP_NUM_THREADS",
    "MKL_NUM_THREADS",
    "OPENBLAS_NUM_THREADS",
    "NUMEXPR_NUM_THREADS",
    "NUMEXPR_MAX_THREADS",
    "POLARS_MAX_THREADS",
    "TF_NUM_INTRAOP_THREADS",
    "LOKY_MAX_CPU_COUNT",
)


def read_settings(path: str = SETTINGS_FILE) -> dict[str, str]:
    """KEY=VALUE lines of threads.conf, as ml-env reads them ({} when it cannot be read)."""
    try:
        with open(path, encoding="utf-8") as f:
            text = f.read()
    except OSError:
        return {}
    out: dict[str, str] = {}
    for line in text.splitlines():
        line = line.strip()
        if line and not line.startswith("#") and "=" in line:
            key, value = line.split("=", 1)
            out[key.strip()] = value.strip().strip("'\"")
    return out


def _assignments(text: str) -> dict[str, int]:
    out: dict[str, int] = {}
    for word in text.split():
        name, sep, value = word.partition("=")
        if sep and name:
            try:
                out[name] = int(value)
            except ValueError:
                continue
    return out


def _share_of(value: int, threads: int, cores: int, floor: int) -> int:
    """ml-env's rule: a count sized for `cores`, cut to `threads` of them (at least `floor`)."""
    return max(floor, value * threads // cores) if cores >= 1 else max(floor, value)


def worker_env(env: dict[str, str], environ: Mapping[str, str], n_jobs: int,
               settings: dict[str, str], joblib_names: tuple[str, ...] = ()) -> dict[str, str]:
    """joblib's environment for `n_jobs` workers (`env`), with every variable that still has the
    value provisioner gave this process cut to the workers' share. Pure: tested without joblib."""
    try:
        threads = int(environ.get(MARKER, ""))
    except ValueError:
        return env
    if threads < 1 or n_jobs < 1:
        return env
    share = max(1, threads // n_jobs)
    out = dict(env)
    names = set(settings.get("variables", "").split() or DEFAULT_VARIABLES) | set(joblib_names)
    for name in sorted(names):
        if environ.get(name) == str(threads):
            out[name] = str(share)
    try:
        cores = int(settings.get("cores", "") or threads)
    except ValueError:
        cores = threads
    zero_ok = set(settings.get("zero_floor", "").split())
    for name, value in _assignments(settings.get("scaled", "")).items():
        floor = 0 if name in zero_ok else 1
        if environ.get(name) == str(_share_of(value, threads, cores, floor)):
            out[name] = str(_share_of(value, share, cores, floor))
    # The workers' own joblib (a nested loky pool) splits their share in turn.
    out[MARKER] = str(share)
    return out


def patch(module) -> bool:
    """Wrap ParallelBackendBase._prepare_worker_env of joblib's module `module` (once)."""
    base = getattr(module, "ParallelBackendBase", None)
    original = getattr(base, "_prepare_worker_env", None)
    if base is None or original is None or getattr(original, "_provisioner_share", False):
        return False

    def _prepare_worker_env(self, n_jobs):  # joblib's signature
        env = original(self, n_jobs)
        if getattr(self, "inner_max_num_threads", None) is not None:
            return env  # the caller chose the workers' threads
        try:
            return worker_env(env, os.environ, int(n_jobs), read_settings(),
                              tuple(getattr(self, "MAX_NUM_THREADS_VARS", ())))
        except Exception:  # never break a user's job over its thread count
            return env

    _prepare_worker_env._provisioner_share = True  # type: ignore[attr-defined]
    base._prepare_worker_env = _prepare_worker_env
    return True


class _Loader:
    """The real loader of joblib._parallel_backends, then the patch."""

    def __init__(self, loader) -> None:
        self._loader = loader

    def create_module(self, spec):
        return self._loader.create_module(spec)

    def exec_module(self, module) -> None:
        self._loader.exec_module(module)
        with contextlib.suppress(Exception):  # joblib works as it always did
            patch(module)

    def __getattr__(self, name: str):  # get_source, is_package, ...
        return getattr(self._loader, name)


class _Finder:
    """A meta path finder that only wraps the loader of joblib._parallel_backends."""

    def find_spec(self, fullname, path=None, target=None):
        if fullname != TARGET:
            return None
        for finder in sys.meta_path:
            if finder is self or not hasattr(finder, "find_spec"):
                continue
            spec = finder.find_spec(fullname, path, target)
            if spec is not None:
                if spec.loader is not None and hasattr(spec.loader, "exec_module"):
                    spec.loader = cast("Loader", _Loader(spec.loader))  # delegates all but exec_module
                return spec
        return None


def install() -> None:
    """Patch joblib now if it is loaded, else when it is imported. Nothing without the marker."""
    if MARKER not in os.environ:
        return
    loaded = sys.modules.get(TARGET)
    if loaded is not None:
        patch(loaded)
    elif not any(isinstance(f, _Finder) for f in sys.meta_path):
        sys.meta_path.insert(0, _Finder())


with contextlib.suppress(Exception):  # a start-up hook must never stop an interpreter
    install()

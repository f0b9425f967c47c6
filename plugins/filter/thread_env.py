"""Filters of the thread_env role: merge thread variables into Jupyter kernelspecs and undo it.

A kernelspec record (what undo needs) is ``{"env_existed": bool, "env": {VAR: old value or
None}}``: the value each thread variable had in the kernelspec's "env" before provisioner
first changed it (None: absent).
"""

from __future__ import annotations

import base64
import json
from typing import Any


def thread_env_kernel(pair: list[Any], files: list[dict[str, Any]]) -> dict[str, Any]:
    """[path, base64 content] and the find results -> the kernelspec as the role handles it.

    ``spec`` is None when the file is not a JSON object (Jupyter skips such a kernelspec too).
    """
    path, content = pair
    try:
        spec = json.loads(base64.b64decode(content).decode("utf-8"))
    except (ValueError, UnicodeDecodeError):
        spec = None
    if not isinstance(spec, dict) or not isinstance(spec.get("env", {}), dict):
        spec = None
    meta = next((f for f in files if f.get("path") == path), {})
    return {
        "path": path,
        "spec": spec,
        "mode": meta.get("mode", "0644"),
        "owner": meta.get("pw_name") or str(meta.get("uid", "root")),
        "group": meta.get("gr_name") or str(meta.get("gid", "root")),
    }


def thread_env_kernel_record(spec: dict[str, Any], names: list[str]) -> dict[str, Any]:
    """The original values of ``names`` in the kernelspec's env (None: absent)."""
    env = spec.get("env") or {}
    return {"env_existed": "env" in spec, "env": {name: env.get(name) for name in names}}


def thread_env_kernel_env(
    spec: dict[str, Any],
    values: dict[str, str],
    record: dict[str, Any] | None,
    override: bool,
) -> dict[str, Any]:
    """The kernelspec's env with the thread variables merged in.

    A kernelspec that set any of these variables before provisioner (its record, or the file
    itself when there is no record yet) chose its own threads: without ``override`` it is left
    as it is.  Otherwise every variable follows ``values``, and a recorded variable that was
    absent before provisioner and is no longer in ``values`` is removed again.
    """
    env = dict(spec.get("env") or {})
    original = record.get("env") or {} if record else {name: env.get(name) for name in values}
    if not override and any(original.get(name) is not None for name in values):
        return env
    for name, value in values.items():
        env[name] = str(value)
    # Variables provisioner added earlier and sets no more (KMP_* after leaving libiomp) go.
    for name, old in original.items():
        if old is None and name not in values:
            env.pop(name, None)
    return env


def thread_env_kernel_merged(spec: dict[str, Any], env: dict[str, Any]) -> dict[str, Any]:
    """The kernelspec with ``env`` in place of its env (kept in its position when present)."""
    merged = dict(spec)
    merged["env"] = env
    return merged


def thread_env_kernel_restored(spec: dict[str, Any], record: dict[str, Any]) -> dict[str, Any]:
    """The kernelspec with the recorded original values of the thread variables back."""
    restored = dict(spec)
    env = dict(spec.get("env") or {})
    for name, old in (record.get("env") or {}).items():
        if old is None:
            env.pop(name, None)
        else:
            env[name] = old
    if env or record.get("env_existed", True) or "env" not in spec:
        if "env" in spec or env:
            restored["env"] = env
    else:
        restored.pop("env", None)
    return restored


def thread_env_kernel_json(spec: dict[str, Any]) -> str:
    """A kernelspec as Jupyter writes it (indent 1, keys in their order, UTF-8)."""
    return json.dumps(spec, indent=1, ensure_ascii=False) + "\n"


class FilterModule:
    def filters(self) -> dict[str, Any]:
        return {
            "thread_env_kernel": thread_env_kernel,
            "thread_env_kernel_record": thread_env_kernel_record,
            "thread_env_kernel_env": thread_env_kernel_env,
            "thread_env_kernel_merged": thread_env_kernel_merged,
            "thread_env_kernel_restored": thread_env_kernel_restored,
            "thread_env_kernel_json": thread_env_kernel_json,
        }

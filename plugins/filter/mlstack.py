"""Filters of the mlstack role: the lock's pins for some components, and whether a wheelhouse
holds a wheel for each of them.  The logic lives in provisioner.bundle (one implementation for
`provisioner bundle` and the role); Ansible runs from provisioner's environment."""

from __future__ import annotations

from typing import Any

from ansible.errors import AnsibleFilterError

try:
    from provisioner import bundle
    from provisioner.errors import ProvisionerError
except ImportError as exc:  # pragma: no cover - only outside provisioner's environment
    bundle = None
    _IMPORT_ERROR = str(exc)


def _need_bundle() -> None:
    if bundle is None:
        raise AnsibleFilterError(
            f"the mlstack role needs provisioner's Python package on the control node ({_IMPORT_ERROR}): "
            "run Ansible from provisioner's environment"
        )


def mlstack_lock(text: str, where: str = "mlstack.lock") -> dict[str, Any]:
    """The lock's text -> {python_version, arch, glibc, components: {name: [pins]}} (validated)."""
    _need_bundle()
    try:
        lock = bundle.parse_lock(text, where)
    except ProvisionerError as exc:
        raise AnsibleFilterError(str(exc)) from None
    return {
        "python_version": lock.python_version,
        "glibc": lock.glibc,
        "arch": lock.arch,
        "components": {k: [str(p) for p in v] for k, v in lock.components.items()},
    }


def mlstack_pins(lock: dict[str, Any], components: list[str]) -> list[str]:
    """NAME==VERSION for every package of COMPONENTS (core included), each name once."""
    _need_bundle()
    try:
        parsed = bundle.Lock(
            python_version=lock["python_version"], glibc=lock["glibc"], arch=lock["arch"], requirements={},
            components={k: [bundle.Pin.parse(p) for p in v] for k, v in lock["components"].items()},
        )
        return [str(p) for p in bundle.select_pins(parsed, components)]
    except ProvisionerError as exc:
        raise AnsibleFilterError(str(exc)) from None


def mlstack_wheelhouse_check(pins: list[str], files: list[str], path: str, lock: dict[str, Any]) -> dict[str, Any]:
    """{ok, files: the wheel for each pin, problems: one line per pin without a usable wheel}."""
    _need_bundle()
    parsed = [bundle.Pin.parse(p) for p in pins]
    check = bundle.validate_wheelhouse(
        path,
        parsed,
        files=[f.rsplit("/", 1)[-1] for f in files],
        python_version=lock["python_version"],
        platforms=bundle.manylinux_platforms(lock["glibc"], lock["arch"]),
    )
    return {
        "ok": check.ok,
        "files": [check.found[p] for p in parsed if p in check.found],
        "problems": check.problems(),
    }


def mlstack_pip_failure(result: dict[str, Any]) -> str:
    """One line from a failed pip run: the package pip could not find, else pip's last error."""
    _need_bundle()
    text = "\n".join(str(result.get(k) or "") for k in ("stderr", "stdout", "msg"))
    name = bundle.missing_package(text)
    if name:
        return f"no wheel for {name} among the available ones"
    errors = [ln.strip() for ln in text.splitlines() if ln.strip().startswith("ERROR")]
    return errors[-1] if errors else (text.strip().splitlines() or ["pip failed"])[-1]


class FilterModule:
    def filters(self) -> dict[str, Any]:
        return {
            "mlstack_lock": mlstack_lock,
            "mlstack_pins": mlstack_pins,
            "mlstack_wheelhouse_check": mlstack_wheelhouse_check,
            "mlstack_pip_failure": mlstack_pip_failure,
        }

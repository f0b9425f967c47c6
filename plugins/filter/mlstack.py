"""Filters of the mlstack role: the lock's pins for some components, whether a wheelhouse
holds a wheel for each of them (the logic lives in provisioner.bundle: one implementation for
`provisioner bundle` and the role; Ansible runs from provisioner's environment), and the real
cause of a failed pip run on a target with its fix."""

from __future__ import annotations

import re
from typing import Any

from ansible.errors import AnsibleFilterError

try:
    from provisioner import bundle
    from provisioner.errors import ProvisionerError
except ImportError as exc:  # pragma: no cover - only outside provisioner's environment
    bundle = None  # type: ignore[assignment]  # _need_bundle() raises before any use
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


# What a failed pip run says when its cause is not the package: each pattern appears in the
# output of pip 23 (Debian 12's venv) and of current pip, taken from real failures
# (tests/unit/test_pip_failure.py). Checked in this order: a certificate or network failure
# also ends in "No matching distribution found", because pip saw no index at all.
_CERT_RE = re.compile(r"CERTIFICATE_VERIFY_FAILED|SSLCertVerificationError|problem confirming the ssl certificate")
_CERT_REASON_RE = re.compile(r"certificate verify failed: ([^(')\"]+?)\s*(?:\(_ssl|'|\")")
_FETCH_URL_RE = re.compile(r"Could not fetch URL (https?://[^/\s:]+)")
_DNS_RE = re.compile(r"Name or service not known|Temporary failure in name resolution|NameResolutionError"
                     r"|No address associated with hostname|\[Errno -[235]\]")
_DNS_HOST_RE = re.compile(r"Failed to resolve '([^']+)'")
_UNREACHABLE_RE = re.compile(
    r"(Connection refused|Connection reset by peer|Network is unreachable|No route to host|timed out"
    r"|ConnectTimeoutError|ReadTimeoutError|Cannot connect to proxy|Tunnel connection failed[^'\"]*)"
)
_CONN_HOST_RE = re.compile(r"HTTPSConnection\(host='([^']+)', port=(\d+)\)")
_INDEXES_RE = re.compile(r"Looking in indexes: (\S+)")
_NO_VERSIONS_RE = re.compile(r"\(from versions: none\)")

_OFFLINE_FIX = "install offline from a wheelhouse instead (provisioner bundle, then -e mlstack_wheelhouse=DIR)"


def _host(url: str) -> str:
    return url.split("://", 1)[-1].split("/", 1)[0].rsplit("@", 1)[-1]


def _index_host(text: str) -> str:
    """The index pip was looking in, as pip names it; PyPI when pip printed none (its default)."""
    found = _INDEXES_RE.findall(text)
    return _host(found[-1].rstrip(",")) if found else "pypi.org"


def mlstack_pip_diagnosis(
    result: dict[str, Any], wheelhouse: str | None = None, lock_file: str = "the lock"
) -> dict[str, str]:
    """A failed pip run -> {kind, cause, fix}: kind is certificate, dns, unreachable, index
    (the index has no such project), wheel (no wheel for a pin) or pip (anything else)."""
    _need_bundle()
    # Ansible's pip module puts both streams in msg, as "stdout: ...\n:stderr: ...".
    text = "\n".join(str(result.get(k) or "") for k in ("stderr", "stdout", "msg"))
    text = re.sub(r"(?m)^(?:stdout|:stderr): ", "", text)
    name = bundle.missing_package(text)
    offline = bool(wheelhouse)
    if not offline and _CERT_RE.search(text):
        reason = _CERT_REASON_RE.search(text)
        url = _FETCH_URL_RE.search(text)
        host = _host(url.group(1)) if url else _index_host(text)
        return {
            "kind": "certificate",
            "cause": f"pip could not verify the TLS certificate of {host}"
                     f" ({reason.group(1).strip() if reason else 'certificate verify failed'})",
            "fix": "a TLS-inspecting proxy (or a private index) signs with a CA this host does not trust: name that "
                   "CA's PEM file on the control node in common_ca_certificates, e.g. "
                   "-e common_ca_certificates=[/path/proxy-ca.pem] (docs/proxy.md)",
        }
    if not offline and _DNS_RE.search(text):
        resolved = _DNS_HOST_RE.search(text)
        host = resolved.group(1) if resolved else _index_host(text)
        return {
            "kind": "dns",
            "cause": f"the host cannot resolve the index's name {host}",
            "fix": "check the host's DNS (/etc/resolv.conf) and the index URL (mlstack_index_url); where only a "
                   "proxy reaches the internet, set https_proxy in the host's environment (docs/proxy.md); or "
                   + _OFFLINE_FIX,
        }
    found = [] if offline else list(dict.fromkeys(m.group(1) for m in _UNREACHABLE_RE.finditer(text)))
    if found:
        proxy = [m for m in found if "proxy" in m.lower() or m.startswith("Tunnel")]
        detail = next((m for m in found if m not in proxy), found[0])
        conn = _CONN_HOST_RE.search(text)
        where = f"{conn.group(1)}:{conn.group(2)}" if conn else ("" if proxy else _index_host(text))
        target = ("its proxy " + where).strip() if proxy else where
        return {
            "kind": "unreachable",
            "cause": f"the host cannot reach {target} ({detail})",
            "fix": "check the host's route to the index: a firewall, the proxy in https_proxy of the host's "
                   "environment (docs/proxy.md), or a mirror in mlstack_index_url; or " + _OFFLINE_FIX,
        }
    if name:
        cause = f"no wheel for {name} among the available ones"
        if offline:
            fix = (f"check that {lock_file} pins it (regenerate the lock) and that the wheelhouse {wheelhouse} was "
                   "built from this lock (provisioner bundle)")
        elif _NO_VERSIONS_RE.search(text):
            cause += f" (the index {_index_host(text)} lists no version of it)"
            fix = ("check that mlstack_index_url and mlstack_extra_index_urls name indexes that serve it, "
                   f"and that {lock_file} names it right (regenerate the lock)")
        else:
            fix = (f"the index has other versions of it: check that {lock_file} pins one it has for this Python "
                   "and platform (regenerate the lock: provisioner bundle --update-lock)")
        return {"kind": "wheel", "cause": cause, "fix": fix}
    errors = [ln.strip() for ln in text.splitlines() if ln.strip().startswith("ERROR")]
    return {
        "kind": "pip",
        "cause": errors[-1] if errors else (text.strip().splitlines() or ["pip failed"])[-1],
        "fix": "the failed command's whole output is in the run's log (provisioner up -v)",
    }


def mlstack_pip_failure(result: dict[str, Any], wheelhouse: str | None = None, lock_file: str = "the lock") -> str:
    """One line from a failed pip run: its real cause (certificate, name resolution, an unreachable
    index, a missing wheel) or else pip's last error."""
    return mlstack_pip_diagnosis(result, wheelhouse, lock_file)["cause"]


class FilterModule:
    def filters(self) -> dict[str, Any]:
        return {
            "mlstack_lock": mlstack_lock,
            "mlstack_pins": mlstack_pins,
            "mlstack_wheelhouse_check": mlstack_wheelhouse_check,
            "mlstack_pip_failure": mlstack_pip_failure,
            "mlstack_pip_diagnosis": mlstack_pip_diagnosis,
        }

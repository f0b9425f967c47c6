"""The real cause of a failed pip run on a target, from pip's real output.

Each output below was captured from a real failure: pip 23.0.1 (what Debian 12's venv
installs, so what the mlstack role runs on a target) and pip 26.3, installing six==1.16.0
(or the unknown six==0.0.99) from PyPI
- cert:      through a TLS-inspecting proxy whose CA pip does not trust,
- refused:   from an index URL whose port takes no connection (https://127.0.0.1:9/simple),
- proxydown: through an https_proxy that takes no connection (http://127.0.0.1:9),
- dns:       from an index whose name does not resolve (https://pypi.invalid/simple),
- missing:   a version PyPI does not have,
- http404:   from a URL that answers but is no index of six (https://pypi.org/nothing-here/).
Each reaches the filter as Ansible's pip module fails: pip's stdout and stderr in `msg`.
"""

from __future__ import annotations

import pytest

from tests.unit.plugin_code import load

filters = load("filter", "mlstack")

OUTPUTS = {
    "cert-p23": (
        "Could not fetch URL https://pypi.org/simple/six/: There was a problem confirming the ssl certificate: HTTPSConnectionPool(host='pypi.org', port=443): Max retries exceeded with url: /simple/six/ (Caused by SSLError(SSLCertVerificationError(1, '[SSL: CERTIFICATE_VERIFY_FAILED] certificate verify failed: self-signed certificate in certificate chain (_ssl.c:992)'))) - skipping\n",
        "WARNING: Retrying (Retry(total=4, connect=None, read=None, redirect=None, status=None)) after connection broken by 'SSLError(SSLCertVerificationError(1, '[SSL: CERTIFICATE_VERIFY_FAILED] certificate verify failed: self-signed certificate in certificate chain (_ssl.c:992)'))': /simple/six/\nWARNING: Retrying (Retry(total=3, connect=None, read=None, redirect=None, status=None)) after connection broken by 'SSLError(SSLCertVerificationError(1, '[SSL: CERTIFICATE_VERIFY_FAILED] certificate verify failed: self-signed certificate in certificate chain (_ssl.c:992)'))': /simple/six/\nWARNING: Retrying (Retry(total=2, connect=None, read=None, redirect=None, status=None)) after connection broken by 'SSLError(SSLCertVerificationError(1, '[SSL: CERTIFICATE_VERIFY_FAILED] certificate verify failed: self-signed certificate in certificate chain (_ssl.c:992)'))': /simple/six/\nWARNING: Retrying (Retry(total=1, connect=None, read=None, redirect=None, status=None)) after connection broken by 'SSLError(SSLCertVerificationError(1, '[SSL: CERTIFICATE_VERIFY_FAILED] certificate verify failed: self-signed certificate in certificate chain (_ssl.c:992)'))': /simple/six/\nWARNING: Retrying (Retry(total=0, connect=None, read=None, redirect=None, status=None)) after connection broken by 'SSLError(SSLCertVerificationError(1, '[SSL: CERTIFICATE_VERIFY_FAILED] certificate verify failed: self-signed certificate in certificate chain (_ssl.c:992)'))': /simple/six/\nERROR: Could not find a version that satisfies the requirement six==1.16.0 (from versions: none)\nERROR: No matching distribution found for six==1.16.0\n",
    ),
    "cert-pnew": (
        "Could not fetch URL https://pypi.org/simple/six/: There was a problem confirming the ssl certificate: [SSL: CERTIFICATE_VERIFY_FAILED] certificate verify failed: self-signed certificate in certificate chain (_ssl.c:992) - skipping\n",
        "WARNING: Retrying (Retry(total=4, connect=None, read=None, redirect=None, status=None)) after connection broken by 'SSLCertVerificationError(1, '[SSL: CERTIFICATE_VERIFY_FAILED] certificate verify failed: self-signed certificate in certificate chain (_ssl.c:992)')': /simple/six/\nWARNING: Retrying (Retry(total=3, connect=None, read=None, redirect=None, status=None)) after connection broken by 'SSLCertVerificationError(1, '[SSL: CERTIFICATE_VERIFY_FAILED] certificate verify failed: self-signed certificate in certificate chain (_ssl.c:992)')': /simple/six/\nWARNING: Retrying (Retry(total=2, connect=None, read=None, redirect=None, status=None)) after connection broken by 'SSLCertVerificationError(1, '[SSL: CERTIFICATE_VERIFY_FAILED] certificate verify failed: self-signed certificate in certificate chain (_ssl.c:992)')': /simple/six/\nWARNING: Retrying (Retry(total=1, connect=None, read=None, redirect=None, status=None)) after connection broken by 'SSLCertVerificationError(1, '[SSL: CERTIFICATE_VERIFY_FAILED] certificate verify failed: self-signed certificate in certificate chain (_ssl.c:992)')': /simple/six/\nWARNING: Retrying (Retry(total=0, connect=None, read=None, redirect=None, status=None)) after connection broken by 'SSLCertVerificationError(1, '[SSL: CERTIFICATE_VERIFY_FAILED] certificate verify failed: self-signed certificate in certificate chain (_ssl.c:992)')': /simple/six/\nERROR: Could not find a version that satisfies the requirement six==1.16.0 (from versions: none)\nERROR: No matching distribution found for six==1.16.0\n",
    ),
    "dns-p23": (
        "Looking in indexes: https://pypi.invalid/simple\n",
        "WARNING: Retrying (Retry(total=4, connect=None, read=None, redirect=None, status=None)) after connection broken by 'NewConnectionError('<pip._vendor.urllib3.connection.HTTPSConnection object at 0x7f8f3394e910>: Failed to establish a new connection: [Errno -2] Name or service not known')': /simple/six/\nWARNING: Retrying (Retry(total=3, connect=None, read=None, redirect=None, status=None)) after connection broken by 'NewConnectionError('<pip._vendor.urllib3.connection.HTTPSConnection object at 0x7f8f3394f7d0>: Failed to establish a new connection: [Errno -2] Name or service not known')': /simple/six/\nWARNING: Retrying (Retry(total=2, connect=None, read=None, redirect=None, status=None)) after connection broken by 'NewConnectionError('<pip._vendor.urllib3.connection.HTTPSConnection object at 0x7f8f3395c410>: Failed to establish a new connection: [Errno -2] Name or service not known')': /simple/six/\nWARNING: Retrying (Retry(total=1, connect=None, read=None, redirect=None, status=None)) after connection broken by 'NewConnectionError('<pip._vendor.urllib3.connection.HTTPSConnection object at 0x7f8f3394f6d0>: Failed to establish a new connection: [Errno -2] Name or service not known')': /simple/six/\nWARNING: Retrying (Retry(total=0, connect=None, read=None, redirect=None, status=None)) after connection broken by 'NewConnectionError('<pip._vendor.urllib3.connection.HTTPSConnection object at 0x7f8f338e4f90>: Failed to establish a new connection: [Errno -2] Name or service not known')': /simple/six/\nERROR: Could not find a version that satisfies the requirement six==1.16.0 (from versions: none)\nERROR: No matching distribution found for six==1.16.0\n",
    ),
    "dns-pnew": (
        "Looking in indexes: https://pypi.invalid/simple\n",
        "WARNING: Retrying (Retry(total=4, connect=None, read=None, redirect=None, status=None)) after connection broken by 'NameResolutionError(\"HTTPSConnection(host='pypi.invalid', port=443): Failed to resolve 'pypi.invalid' ([Errno -2] Name or service not known)\")': /simple/six/\nWARNING: Retrying (Retry(total=3, connect=None, read=None, redirect=None, status=None)) after connection broken by 'NameResolutionError(\"HTTPSConnection(host='pypi.invalid', port=443): Failed to resolve 'pypi.invalid' ([Errno -2] Name or service not known)\")': /simple/six/\nWARNING: Retrying (Retry(total=2, connect=None, read=None, redirect=None, status=None)) after connection broken by 'NameResolutionError(\"HTTPSConnection(host='pypi.invalid', port=443): Failed to resolve 'pypi.invalid' ([Errno -2] Name or service not known)\")': /simple/six/\nWARNING: Retrying (Retry(total=1, connect=None, read=None, redirect=None, status=None)) after connection broken by 'NameResolutionError(\"HTTPSConnection(host='pypi.invalid', port=443): Failed to resolve 'pypi.invalid' ([Errno -2] Name or service not known)\")': /simple/six/\nWARNING: Retrying (Retry(total=0, connect=None, read=None, redirect=None, status=None)) after connection broken by 'NameResolutionError(\"HTTPSConnection(host='pypi.invalid', port=443): Failed to resolve 'pypi.invalid' ([Errno -2] Name or service not known)\")': /simple/six/\nERROR: Could not find a version that satisfies the requirement six==1.16.0 (from versions: none)\nERROR: No matching distribution found for six==1.16.0\n",
    ),
    "http404-p23": (
        "Looking in indexes: https://pypi.org/nothing-here/\n",
        "ERROR: Could not find a version that satisfies the requirement six==1.16.0 (from versions: none)\nERROR: No matching distribution found for six==1.16.0\n",
    ),
    "http404-pnew": (
        "Looking in indexes: https://pypi.org/nothing-here/\n",
        "ERROR: Could not find a version that satisfies the requirement six==1.16.0 (from versions: none)\nERROR: No matching distribution found for six==1.16.0\n",
    ),
    "missing-p23": (
        "",
        "ERROR: Could not find a version that satisfies the requirement six==0.0.99 (from versions: 0.9.0, 0.9.1, 0.9.2, 1.0b1, 1.0.0, 1.1.0, 1.2.0, 1.3.0, 1.4.0, 1.4.1, 1.5.0, 1.5.1, 1.5.2, 1.6.0, 1.6.1, 1.7.0, 1.7.1, 1.7.2, 1.7.3, 1.8.0, 1.9.0, 1.10.0, 1.11.0, 1.12.0, 1.13.0, 1.14.0, 1.15.0, 1.16.0, 1.17.0)\nERROR: No matching distribution found for six==0.0.99\n",
    ),
    "missing-pnew": (
        "",
        "ERROR: Could not find a version that satisfies the requirement six==0.0.99 (from versions: 0.9.0, 0.9.1, 0.9.2, 1.0b1, 1.0.0, 1.1.0, 1.2.0, 1.3.0, 1.4.0, 1.4.1, 1.5.0, 1.5.1, 1.5.2, 1.6.0, 1.6.1, 1.7.0, 1.7.1, 1.7.2, 1.7.3, 1.8.0, 1.9.0, 1.10.0, 1.11.0, 1.12.0, 1.13.0, 1.14.0, 1.15.0, 1.16.0, 1.17.0)\nERROR: No matching distribution found for six==0.0.99\n",
    ),
    "proxydown-p23": (
        "",
        "WARNING: Retrying (Retry(total=4, connect=None, read=None, redirect=None, status=None)) after connection broken by 'ProxyError('Cannot connect to proxy.', NewConnectionError('<pip._vendor.urllib3.connection.HTTPSConnection object at 0x7ff29a505610>: Failed to establish a new connection: [Errno 111] Connection refused'))': /simple/six/\nWARNING: Retrying (Retry(total=3, connect=None, read=None, redirect=None, status=None)) after connection broken by 'ProxyError('Cannot connect to proxy.', NewConnectionError('<pip._vendor.urllib3.connection.HTTPSConnection object at 0x7ff29a506350>: Failed to establish a new connection: [Errno 111] Connection refused'))': /simple/six/\nWARNING: Retrying (Retry(total=2, connect=None, read=None, redirect=None, status=None)) after connection broken by 'ProxyError('Cannot connect to proxy.', NewConnectionError('<pip._vendor.urllib3.connection.HTTPSConnection object at 0x7ff29a506a90>: Failed to establish a new connection: [Errno 111] Connection refused'))': /simple/six/\nWARNING: Retrying (Retry(total=1, connect=None, read=None, redirect=None, status=None)) after connection broken by 'ProxyError('Cannot connect to proxy.', NewConnectionError('<pip._vendor.urllib3.connection.HTTPSConnection object at 0x7ff29a5072d0>: Failed to establish a new connection: [Errno 111] Connection refused'))': /simple/six/\nWARNING: Retrying (Retry(total=0, connect=None, read=None, redirect=None, status=None)) after connection broken by 'ProxyError('Cannot connect to proxy.', NewConnectionError('<pip._vendor.urllib3.connection.HTTPSConnection object at 0x7ff29a6820d0>: Failed to establish a new connection: [Errno 111] Connection refused'))': /simple/six/\nERROR: Could not find a version that satisfies the requirement six==1.16.0 (from versions: none)\nERROR: No matching distribution found for six==1.16.0\n",
    ),
    "proxydown-pnew": (
        "",
        "WARNING: Retrying (Retry(total=4, connect=None, read=None, redirect=None, status=None)) after connection broken by 'NewConnectionError(\"HTTPSConnection(host='127.0.0.1', port=9): Failed to establish a new connection: [Errno 111] Connection refused\")': /simple/six/\nWARNING: Retrying (Retry(total=3, connect=None, read=None, redirect=None, status=None)) after connection broken by 'NewConnectionError(\"HTTPSConnection(host='127.0.0.1', port=9): Failed to establish a new connection: [Errno 111] Connection refused\")': /simple/six/\nWARNING: Retrying (Retry(total=2, connect=None, read=None, redirect=None, status=None)) after connection broken by 'NewConnectionError(\"HTTPSConnection(host='127.0.0.1', port=9): Failed to establish a new connection: [Errno 111] Connection refused\")': /simple/six/\nWARNING: Retrying (Retry(total=1, connect=None, read=None, redirect=None, status=None)) after connection broken by 'NewConnectionError(\"HTTPSConnection(host='127.0.0.1', port=9): Failed to establish a new connection: [Errno 111] Connection refused\")': /simple/six/\nWARNING: Retrying (Retry(total=0, connect=None, read=None, redirect=None, status=None)) after connection broken by 'NewConnectionError(\"HTTPSConnection(host='127.0.0.1', port=9): Failed to establish a new connection: [Errno 111] Connection refused\")': /simple/six/\nERROR: Could not find a version that satisfies the requirement six==1.16.0 (from versions: none)\nERROR: No matching distribution found for six==1.16.0\n",
    ),
    "refused-p23": (
        "Looking in indexes: https://127.0.0.1:9/simple\n",
        "WARNING: Retrying (Retry(total=4, connect=None, read=None, redirect=None, status=None)) after connection broken by 'NewConnectionError('<pip._vendor.urllib3.connection.HTTPSConnection object at 0x7f3b50742b90>: Failed to establish a new connection: [Errno 111] Connection refused')': /simple/six/\nWARNING: Retrying (Retry(total=3, connect=None, read=None, redirect=None, status=None)) after connection broken by 'NewConnectionError('<pip._vendor.urllib3.connection.HTTPSConnection object at 0x7f3b50743990>: Failed to establish a new connection: [Errno 111] Connection refused')': /simple/six/\nWARNING: Retrying (Retry(total=2, connect=None, read=None, redirect=None, status=None)) after connection broken by 'NewConnectionError('<pip._vendor.urllib3.connection.HTTPSConnection object at 0x7f3b50750690>: Failed to establish a new connection: [Errno 111] Connection refused')': /simple/six/\nWARNING: Retrying (Retry(total=1, connect=None, read=None, redirect=None, status=None)) after connection broken by 'NewConnectionError('<pip._vendor.urllib3.connection.HTTPSConnection object at 0x7f3b507437d0>: Failed to establish a new connection: [Errno 111] Connection refused')': /simple/six/\nWARNING: Retrying (Retry(total=0, connect=None, read=None, redirect=None, status=None)) after connection broken by 'NewConnectionError('<pip._vendor.urllib3.connection.HTTPSConnection object at 0x7f3b506d89d0>: Failed to establish a new connection: [Errno 111] Connection refused')': /simple/six/\nERROR: Could not find a version that satisfies the requirement six==1.16.0 (from versions: none)\nERROR: No matching distribution found for six==1.16.0\n",
    ),
    "refused-pnew": (
        "Looking in indexes: https://127.0.0.1:9/simple\n",
        "WARNING: Retrying (Retry(total=4, connect=None, read=None, redirect=None, status=None)) after connection broken by 'NewConnectionError(\"HTTPSConnection(host='127.0.0.1', port=9): Failed to establish a new connection: [Errno 111] Connection refused\")': /simple/six/\nWARNING: Retrying (Retry(total=3, connect=None, read=None, redirect=None, status=None)) after connection broken by 'NewConnectionError(\"HTTPSConnection(host='127.0.0.1', port=9): Failed to establish a new connection: [Errno 111] Connection refused\")': /simple/six/\nWARNING: Retrying (Retry(total=2, connect=None, read=None, redirect=None, status=None)) after connection broken by 'NewConnectionError(\"HTTPSConnection(host='127.0.0.1', port=9): Failed to establish a new connection: [Errno 111] Connection refused\")': /simple/six/\nWARNING: Retrying (Retry(total=1, connect=None, read=None, redirect=None, status=None)) after connection broken by 'NewConnectionError(\"HTTPSConnection(host='127.0.0.1', port=9): Failed to establish a new connection: [Errno 111] Connection refused\")': /simple/six/\nWARNING: Retrying (Retry(total=0, connect=None, read=None, redirect=None, status=None)) after connection broken by 'NewConnectionError(\"HTTPSConnection(host='127.0.0.1', port=9): Failed to establish a new connection: [Errno 111] Connection refused\")': /simple/six/\nERROR: Could not find a version that satisfies the requirement six==1.16.0 (from versions: none)\nERROR: No matching distribution found for six==1.16.0\n",
    ),
}


def failed(case: str) -> dict[str, str]:
    out, err = OUTPUTS[case]
    return {"msg": f"stdout: {out}\n:stderr: {err}", "cmd": "/opt/mlstack/bin/pip install six==1.16.0"}


PIPS = ["p23", "pnew"]


@pytest.mark.parametrize("pip", PIPS)
def test_an_untrusted_certificate_is_named_with_the_ca_option(pip):
    """The failure a TLS-inspecting proxy causes ends in 'No matching distribution found' too:
    it must not read as a missing wheel."""
    d = filters.mlstack_pip_diagnosis(failed(f"cert-{pip}"))
    assert d["kind"] == "certificate"
    assert d["cause"] == "pip could not verify the TLS certificate of pypi.org (self-signed certificate in certificate chain)"
    assert "common_ca_certificates" in d["fix"] and "docs/proxy.md" in d["fix"]
    assert filters.mlstack_pip_failure(failed(f"cert-{pip}")) == d["cause"]


# A failure on the way to the index: its kind, its cause (per pip where the two differ), the words
# its fix must name.
UNREACHED = {
    "dns": (
        "dns",
        "the host cannot resolve the index's name pypi.invalid",
        ("/etc/resolv.conf", "https_proxy", "mlstack_wheelhouse"),
    ),
    # pip 23 names no host in its retry lines (the index comes from "Looking in indexes"), current pip does.
    "refused": (
        "unreachable",
        "the host cannot reach 127.0.0.1:9 (Connection refused)",
        ("firewall", "mlstack_index_url", "mlstack_wheelhouse"),
    ),
    # pip 23 says it was the proxy; current pip names the proxy's address only.
    "proxydown": (
        "unreachable",
        {
            "p23": "the host cannot reach its proxy (Connection refused)",
            "pnew": "the host cannot reach 127.0.0.1:9 (Connection refused)",
        },
        ("https_proxy",),
    ),
    "http404": (
        "wheel",
        "no wheel for six==1.16.0 among the available ones (the index pypi.org lists no version of it)",
        ("mlstack_index_url",),
    ),
}


@pytest.mark.parametrize("pip", PIPS)
@pytest.mark.parametrize("case", UNREACHED)
def test_an_index_that_cannot_be_reached_or_lacks_the_project_is_named(case, pip):
    """A name that does not resolve, an index or a proxy that takes no connection, an index without the project."""
    kind, cause, fix_names = UNREACHED[case]
    d = filters.mlstack_pip_diagnosis(failed(f"{case}-{pip}"))
    assert d["kind"] == kind
    assert d["cause"] == (cause[pip] if isinstance(cause, dict) else cause)
    assert [name for name in fix_names if name not in d["fix"]] == []


@pytest.mark.parametrize("pip", PIPS)
def test_a_version_the_index_lacks_is_a_missing_wheel_naming_the_lock(pip):
    d = filters.mlstack_pip_diagnosis(failed(f"missing-{pip}"), None, "/srv/mlstack.lock")
    assert d["kind"] == "wheel"
    assert d["cause"] == "no wheel for six==0.0.99 among the available ones"
    assert "/srv/mlstack.lock pins one it has" in d["fix"] and "--update-lock" in d["fix"]


def test_offline_a_missing_wheel_names_the_wheelhouse_and_the_lock():
    """With --no-index (a wheelhouse) pip contacts no index: only the wheelhouse or the lock can be wrong."""
    result = {
        "msg": "stdout: Looking in links: /var/cache/provisioner/mlstack-wheelhouse\n\n:stderr: "
        "ERROR: Could not find a version that satisfies the requirement numpy>=1.24.1 (from versions: none)\n"
        "ERROR: No matching distribution found for numpy>=1.24.1\n"
    }
    d = filters.mlstack_pip_diagnosis(result, "/srv/wheels", "/srv/mlstack.lock")
    assert d == {
        "kind": "wheel",
        "cause": "no wheel for numpy>=1.24.1 among the available ones",
        "fix": "check that /srv/mlstack.lock pins it (regenerate the lock) and that the wheelhouse /srv/wheels "
        "was built from this lock (provisioner bundle)",
    }


def test_any_other_failure_is_pips_last_error():
    result = {
        "msg": "stdout: \n:stderr: ERROR: Could not install packages due to an OSError: [Errno 28] No space left on device\n"
    }
    d = filters.mlstack_pip_diagnosis(result)
    assert d["kind"] == "pip"
    assert d["cause"] == "ERROR: Could not install packages due to an OSError: [Errno 28] No space left on device"

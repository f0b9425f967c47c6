"""Online installs behind a TLS-inspecting proxy, for real: a lab server whose route to PyPI goes
through such a proxy on this machine (https_proxy in the server's /etc/environment, as companies
set it), and role common's common_ca_certificates naming the proxy's CA.

- A CA file that is no PEM certificate is refused by site.yml's input check: one line naming the
  file, exit 2, the host untouched.
- Without the CA, the mlstack role's online pip install fails naming the certificate and the
  option that fixes it (not "no wheel", which is how pip's own last line reads).
- With it, the same install succeeds through the proxy; the system store trusts the CA too
  (what apt and Python's ssl read); a second run of role common changes nothing; undo removes the
  CA and pip's configuration, and the proxy is refused again.

The install is one small pure-Python package (a one-pin lock: the role's whole online pip path,
with seconds of download instead of the stack's 1.2 GB). The proxy is the small one below, not
mitmproxy: mitmproxy on Python 3.11 pins older cryptography and h11 than this environment's, and
Debian's squid-openssl is a system service listening on every address.
"""

from __future__ import annotations

import contextlib
import datetime
import inspect
import re
import select
import shutil
import socket
import ssl
import subprocess
import sys
import tempfile
import threading
from collections.abc import Iterator
from pathlib import Path

import pytest
import yaml
from cryptography import x509
from cryptography.hazmat.primitives import hashes, serialization
from cryptography.hazmat.primitives.asymmetric import ec
from cryptography.x509.oid import ExtendedKeyUsageOID, NameOID
from playbook_run import run_playbook

from provisioner import bundle, lab
from provisioner.errors import ExitCode

pytestmark = pytest.mark.lab

BINDIR = Path(sys.executable).parent
SERVER = "pxy-proxy"
PIP_CONF = "/etc/xdg/pip/pip.conf"
CA_DIR = "/usr/local/share/ca-certificates/provisioner"


def _name(cn: str) -> x509.Name:
    return x509.Name(
        [x509.NameAttribute(NameOID.ORGANIZATION_NAME, "Inspecting Proxy"), x509.NameAttribute(NameOID.COMMON_NAME, cn)]
    )


def _pem(cert: x509.Certificate) -> bytes:
    return cert.public_bytes(serialization.Encoding.PEM)


def _key_usage(*allowed: str) -> x509.KeyUsage:
    """A key usage extension that allows ALLOWED (named as x509.KeyUsage's arguments) and nothing else."""
    return x509.KeyUsage(**{usage: usage in allowed for usage in inspect.signature(x509.KeyUsage).parameters})


class InspectingProxy:
    """A TLS-inspecting HTTP proxy as companies run them: CONNECT host:443 is answered, the client's
    TLS is ended with a certificate for that host signed by the proxy's own CA (sent along with the
    CA, as such proxies do), and a second TLS connection to the real host carries the decrypted
    bytes on. A client that does not trust the proxy's CA fails its certificate check."""

    def __init__(self, listen: str, port: int = 0) -> None:
        self.dir = Path(tempfile.mkdtemp(prefix="inspecting-proxy-"))
        now = datetime.datetime.now(datetime.UTC)
        self._now = now
        self._ca_key = ec.generate_private_key(ec.SECP256R1())
        self.ca = (
            x509.CertificateBuilder()
            .subject_name(_name("Inspecting Proxy CA"))
            .issuer_name(_name("Inspecting Proxy CA"))
            .public_key(self._ca_key.public_key())
            .serial_number(x509.random_serial_number())
            .not_valid_before(now - datetime.timedelta(days=1))
            .not_valid_after(now + datetime.timedelta(days=30))
            .add_extension(x509.BasicConstraints(ca=True, path_length=0), critical=True)
            .add_extension(_key_usage("digital_signature", "key_cert_sign", "crl_sign"), critical=True)
            .add_extension(x509.SubjectKeyIdentifier.from_public_key(self._ca_key.public_key()), critical=False)
            .sign(self._ca_key, hashes.SHA256())
        )
        self.ca_file = self.dir / "proxy-ca.pem"
        self.ca_file.write_bytes(_pem(self.ca))
        self._contexts: dict[str, ssl.SSLContext] = {}
        self._lock = threading.Lock()
        self._upstream = ssl.create_default_context()
        self.connects: list[str] = []
        self.sock = socket.create_server((listen, port))
        self.address = f"{listen}:{self.sock.getsockname()[1]}"
        self._stop = threading.Event()
        self._thread = threading.Thread(target=self._serve, daemon=True)

    def _context(self, host: str) -> ssl.SSLContext:
        with self._lock:
            if host not in self._contexts:
                key = ec.generate_private_key(ec.SECP256R1())
                cert = (
                    x509.CertificateBuilder()
                    .subject_name(_name(host))
                    .issuer_name(self.ca.subject)
                    .public_key(key.public_key())
                    .serial_number(x509.random_serial_number())
                    .not_valid_before(self._now - datetime.timedelta(days=1))
                    .not_valid_after(self._now + datetime.timedelta(days=30))
                    .add_extension(x509.SubjectAlternativeName([x509.DNSName(host)]), critical=False)
                    .add_extension(x509.BasicConstraints(ca=False, path_length=None), critical=True)
                    .add_extension(x509.ExtendedKeyUsage([ExtendedKeyUsageOID.SERVER_AUTH]), critical=False)
                    .add_extension(x509.AuthorityKeyIdentifier.from_issuer_public_key(self._ca_key.public_key()), critical=False)
                    .sign(self._ca_key, hashes.SHA256())
                )
                chain = self.dir / f"{host}.pem"
                chain.write_bytes(
                    _pem(cert)
                    + _pem(self.ca)
                    + key.private_bytes(
                        serialization.Encoding.PEM, serialization.PrivateFormat.PKCS8, serialization.NoEncryption()
                    )
                )
                ctx = ssl.SSLContext(ssl.PROTOCOL_TLS_SERVER)
                ctx.load_cert_chain(chain)
                self._contexts[host] = ctx
            return self._contexts[host]

    def start(self) -> InspectingProxy:
        self._thread.start()
        return self

    def stop(self) -> None:
        self._stop.set()
        self.sock.close()
        self._thread.join(timeout=5)
        shutil.rmtree(self.dir, ignore_errors=True)

    def _serve(self) -> None:
        while not self._stop.is_set():
            try:
                client, _ = self.sock.accept()
            except OSError:
                return
            threading.Thread(target=self._handle, args=(client,), daemon=True).start()

    def _handle(self, client: socket.socket) -> None:
        with contextlib.ExitStack() as stack:
            stack.enter_context(client)
            client.settimeout(60)
            head = b""
            while b"\r\n\r\n" not in head:
                chunk = client.recv(4096)
                if not chunk or len(head) > 65536:
                    return
                head += chunk
            method, target = head.split(b"\r\n", 1)[0].decode("latin-1").split(" ")[:2]
            if method != "CONNECT":
                client.sendall(b"HTTP/1.1 405 Only CONNECT\r\nContent-Length: 0\r\nConnection: close\r\n\r\n")
                return
            host, _, port = target.rpartition(":")
            self.connects.append(target)
            try:
                upstream = stack.enter_context(socket.create_connection((host, int(port)), timeout=30))
            except OSError:
                client.sendall(b"HTTP/1.1 502 Bad Gateway\r\nContent-Length: 0\r\nConnection: close\r\n\r\n")
                return
            client.sendall(b"HTTP/1.1 200 Connection established\r\n\r\n")
            try:
                inner = stack.enter_context(self._context(host).wrap_socket(client, server_side=True))
                outer = stack.enter_context(self._upstream.wrap_socket(upstream, server_hostname=host))
            except (OSError, ssl.SSLError):
                return  # the client refused the proxy's certificate: what an untrusting client does
            self._relay(inner, outer)

    @staticmethod
    def _relay(a: ssl.SSLSocket, b: ssl.SSLSocket) -> None:
        peers = {a: b, b: a}
        while True:
            ready = [s for s in peers if s.pending()] or select.select(list(peers), [], [], 60)[0]
            if not ready:
                return
            for s in ready:
                try:
                    data = s.recv(65536)
                except (OSError, ssl.SSLError):
                    return
                if not data:
                    return
                try:
                    peers[s].sendall(data)
                except OSError:
                    return


PLAYBOOK = [
    {
        "name": "Base system and the ML environment, online",
        "hosts": "all",
        "gather_facts": True,
        "gather_subset": ["min"],
        "roles": [{"role": "common"}, {"role": "mlstack"}],
    }
]
# Of role common's base packages, what these runs need: the ML environment's venv and the trust
# store the CA goes into (installing the whole list is test_up's, on a fresh server).
BASE_PACKAGES = ["python3-venv", "ca-certificates"]
COMMON = [{"name": "Base system", "hosts": "all", "gather_facts": True, "gather_subset": ["min"], "roles": [{"role": "common"}]}]
UNDO = [
    {
        "name": "Undo common",
        "hosts": "all",
        "gather_facts": False,
        "tasks": [{"name": "Undo common", "ansible.builtin.include_role": {"name": "common", "tasks_from": "undo"}}],
    }
]


def ssh(server: lab.LabServer, command: str) -> subprocess.CompletedProcess:
    return subprocess.run(
        ["ssh", "-F", str(server.ssh_config), server.name, command], capture_output=True, text=True, timeout=120
    )


@pytest.fixture(scope="module")
def server(lab_requirements) -> Iterator[lab.LabServer]:
    try:
        yield lab.up(SERVER)
    finally:
        lab.down(SERVER)


@pytest.fixture(scope="module")
def proxy(server) -> Iterator[InspectingProxy]:
    """The proxy on this machine's end of the server's link only, and the server sent through it."""
    bridge = server.address.rsplit(".", 1)[0] + ".1"
    p = InspectingProxy(bridge).start()
    try:
        r = ssh(server, f"printf 'https_proxy=http://{p.address}\\nHTTPS_PROXY=http://{p.address}\\n' >> /etc/environment")
        assert r.returncode == 0, r.stderr
        yield p
    finally:
        p.stop()


@pytest.fixture(scope="module")
def lock(tmp_path_factory) -> Path:
    pin = next(str(p) for p in bundle.select_pins(bundle.load_lock(), ["core"]) if p.name == "threadpoolctl")
    path = tmp_path_factory.mktemp("proxy") / "mlstack.lock"
    path.write_text(
        yaml.safe_dump({"schema": 1, "python_version": "3.11", "glibc": "2.28", "arch": "x86_64", "components": {"core": [pin]}})
    )
    return path


def one_line(r: subprocess.CompletedProcess) -> str:
    return re.sub(r"\s+", " ", r.stdout + r.stderr)


def changed(r: subprocess.CompletedProcess) -> int:
    found = re.search(r"changed=(\d+)", r.stdout.rsplit("PLAY RECAP", 1)[-1])
    assert found, r.stdout
    return int(found.group(1))


def system_fetch(server: lab.LabServer) -> subprocess.CompletedProcess:
    """PyPI through the proxy with the system store (what apt and Python's ssl trust), in a login
    environment (/etc/environment holds the proxy)."""
    return ssh(server, "python3 -c \"import urllib.request; urllib.request.urlopen('https://pypi.org/simple/six/', timeout=30)\"")


def test_a_ca_file_that_is_no_certificate_is_refused_before_any_change(server, proxy, tmp_path):
    bad = tmp_path / "proxy-ca.der"
    bad.write_bytes(b"\x30\x82\x01\x0a not PEM")
    r = subprocess.run(
        [str(BINDIR / "provisioner"), "up", "-i", str(server.inventory), "--no-smoke", "-e", f"common_ca_certificates=[{bad}]"],
        capture_output=True,
        text=True,
        timeout=600,
    )
    assert r.returncode == ExitCode.BAD_INPUT, r.stdout[-2000:] + r.stderr[-2000:]
    assert f"common_ca_certificates: {bad} is not a PEM certificate" in one_line(r), r.stderr[-2000:]
    assert ssh(server, f"test ! -e {CA_DIR} && test ! -e /etc/provisioner").returncode == 0, "the host was changed"


def test_without_the_ca_pip_names_the_certificate_and_the_option(server, proxy, lock, tmp_path):
    r = run_playbook(
        server, tmp_path, PLAYBOOK, mlstack_components=["core"], mlstack_lock_file=str(lock), common_packages=BASE_PACKAGES
    )
    text = one_line(r)
    assert r.returncode != 0, text[-2000:]
    assert "pip could not verify the TLS certificate of pypi.org (self-signed certificate in certificate chain)" in text, text[
        -3000:
    ]
    assert "common_ca_certificates=[" in text and "no wheel for" not in text, text[-3000:]
    assert "pypi.org:443" in proxy.connects, "pip did not go through the proxy"


def test_with_the_proxys_ca_the_install_succeeds_and_undo_removes_it(server, proxy, lock, tmp_path):
    # A one-pin lock has none of the core libraries the doctor checks: the generation goes live unproven.
    options = {
        "mlstack_components": ["core"],
        "mlstack_lock_file": str(lock),
        "common_ca_certificates": [str(proxy.ca_file)],
        "mlstack_prove": False,
        "common_packages": BASE_PACKAGES,
    }
    check = run_playbook(server, tmp_path, COMMON, "--check", **options)
    assert check.returncode == 0 and changed(check) > 0, one_line(check)[-3000:]
    assert ssh(server, f"test ! -e {CA_DIR} && test ! -e {PIP_CONF}").returncode == 0, "check mode changed the host"
    before = len(proxy.connects)
    r = run_playbook(server, tmp_path, PLAYBOOK, **options)
    assert r.returncode == 0, one_line(r)[-3000:]
    assert "files.pythonhosted.org:443" in proxy.connects[before:], "the wheel did not come through the proxy"
    assert ssh(server, "su - ml -c '/opt/mlstack/bin/python -c \"import threadpoolctl\"'").returncode == 0
    assert system_fetch(server).returncode == 0, system_fetch(server).stderr[-1000:]
    # The CA and pip's configuration are role common's: its second run changes nothing (mlstack's
    # second run is test_up's and molecule's).
    again = run_playbook(server, tmp_path, COMMON, **options)
    assert again.returncode == 0 and changed(again) == 0, one_line(again)[-3000:]

    undo = run_playbook(server, tmp_path, UNDO)
    assert undo.returncode == 0, one_line(undo)[-3000:]
    assert ssh(server, f"test ! -e {CA_DIR} && test ! -e {PIP_CONF}").returncode == 0
    refused = system_fetch(server)
    assert refused.returncode != 0 and "CERTIFICATE_VERIFY_FAILED" in refused.stderr, refused.stderr[-1000:]

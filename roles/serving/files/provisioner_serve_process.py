"""The model server's process set-up: threads, CPUs, the serving socket (systemd socket
activation or SO_REUSEPORT), systemd notification and uvicorn without its signal handling.
"""

from __future__ import annotations

import contextlib
import os
import socket
import sys
from collections.abc import Iterator
from typing import Any

from provisioner_serve_config import (
    BACKLOG,
    DRAIN_SECONDS,
    SD_LISTEN_FDS_START,
    THREAD_VARS,
    BadInput,
)

# ---------------------------------------------------------------------------------------
# Process set-up: threads, CPUs, sockets, systemd


def log(message: str) -> None:
    print(message, file=sys.stderr, flush=True)


def set_threads(threads: int) -> None:
    for var in THREAD_VARS:
        os.environ[var] = str(threads)


def set_affinity(cpus: list[int]) -> None:
    wanted = set(cpus)
    current = os.sched_getaffinity(0)
    if current <= wanted:
        return  # already inside the slice (the unit's CPUAffinity=)
    try:
        os.sched_setaffinity(0, wanted)
    except OSError as exc:
        raise BadInput(
            f"cannot pin this worker to CPUs {sorted(wanted)} ({exc.strerror}); this process may use {sorted(current)}: fix the workers' cpus"
        ) from None


def inherited_socket() -> socket.socket | None:
    """The serving socket systemd passed (socket activation), or None."""
    count = os.environ.get("LISTEN_FDS")
    pid = os.environ.get("LISTEN_PID")
    if not count or (pid and pid.isdigit() and int(pid) != os.getpid()):
        return None
    for var in ("LISTEN_FDS", "LISTEN_PID", "LISTEN_FDNAMES"):
        os.environ.pop(var, None)
    if not count.isdigit() or int(count) < 1:
        return None
    sock = socket.socket(fileno=SD_LISTEN_FDS_START)
    if sock.type != socket.SOCK_STREAM or not sock.getsockopt(socket.SOL_SOCKET, socket.SO_ACCEPTCONN):
        raise BadInput("the socket systemd passed (fd 3) is not a listening stream socket; check provisioner-serve.socket")
    sock.set_inheritable(False)
    sock.setblocking(False)
    return sock


def bind(host: str, port: int, reuseport: bool, what: str) -> socket.socket:
    family = socket.AF_INET6 if ":" in host else socket.AF_INET
    sock = socket.socket(family, socket.SOCK_STREAM)
    try:
        sock.setsockopt(socket.SOL_SOCKET, socket.SO_REUSEADDR, 1)
        if reuseport:
            sock.setsockopt(socket.SOL_SOCKET, socket.SO_REUSEPORT, 1)
        sock.bind((host, port))
        sock.listen(BACKLOG)
    except OSError as exc:
        sock.close()
        hint = (
            " (a process that does not share it with SO_REUSEPORT holds it)"
            if reuseport
            else " (is this worker already running?)"
        )
        raise BadInput(
            f"cannot listen on {host}:{port} for the {what}: {exc.strerror}{hint if exc.errno == 98 else ''}"
        ) from None
    sock.setblocking(False)
    return sock


def sd_notify(message: str) -> None:
    address = os.environ.get("NOTIFY_SOCKET")
    if not address:
        return
    if address.startswith("@"):
        address = "\0" + address[1:]
    try:
        with socket.socket(socket.AF_UNIX, socket.SOCK_DGRAM) as sock:
            sock.connect(address)
            sock.sendall(message.encode())
    except OSError as exc:
        log(f"cannot notify systemd at {address!r}: {exc.strerror}")


def _uvicorn_server(app: Any) -> Any:
    import uvicorn

    class Server(uvicorn.Server):
        """uvicorn without its own signal handling: the worker drains itself."""

        @contextlib.contextmanager
        def capture_signals(self) -> Iterator[None]:
            yield

    config = uvicorn.Config(
        app,
        lifespan="off",
        access_log=False,
        log_level="warning",
        proxy_headers=False,
        server_header=False,
        timeout_graceful_shutdown=int(DRAIN_SECONDS) + 2,
        backlog=BACKLOG,
    )
    return Server(config)

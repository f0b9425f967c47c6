"""SIGINT and SIGTERM stop the command's run as a whole: its process group, and the processes
of the run that left it."""

from __future__ import annotations

import os
import signal
import time
from collections.abc import Iterator
from contextlib import contextmanager, suppress
from typing import Any

from ..errors import Interrupted

# SIGINT or SIGTERM to the command (a terminal's Ctrl-C, a supervisor, a CI cancel, kill -INT PID)
# stops its run as a whole. ansible-runner starts ansible-playbook in a session of its own (on a
# pty), so neither a terminal's Ctrl-C nor a signal to this process alone reaches it: the handler
# sends SIGINT to the run's process group (ansible-playbook, its workers, their ssh), waits for
# ansible-playbook to end as it does on Ctrl-C, and kills the group after INTERRUPT_GRACE_SECONDS
# or at a second signal. Processes of the run that left the group (an ssh master, Mitogen's
# children) are found by RUN_MARKER_ENV in their environment and ended too.
INTERRUPT_SIGNALS = (signal.SIGINT, signal.SIGTERM)
INTERRUPT_GRACE_SECONDS = 20.0
RUN_MARKER_ENV = "PROVISIONER_RUN"


class _Interruption:
    """The signal that stopped this command, and what the handler does with it."""

    def __init__(self) -> None:
        self.signum = 0
        self.count = 0
        self.at = 0.0
        self.forwarded = False
        self.running = False  # inside ansible_runner.run: forward, never raise

    def reset(self) -> None:
        self.__init__()  # type: ignore[misc]

    def handle(self, signum: int, frame: Any = None) -> None:
        self.count += 1
        if not self.signum:
            self.signum, self.at = signum, time.monotonic()
        if not self.running:
            raise Interrupted(self.signum)
        # A second signal: no more waiting.
        self.forwarded = forward_to_runs(signal.SIGINT if self.count == 1 else signal.SIGKILL) or self.forwarded

    def cancel(self) -> bool:
        """ansible-runner's cancel_callback (polled while the run goes on): True kills the run's group."""
        if not self.signum:
            return False
        if not self.forwarded:  # the signal came while ansible-playbook was being started
            self.forwarded = forward_to_runs(signal.SIGINT)
        return time.monotonic() - self.at > INTERRUPT_GRACE_SECONDS

    def check(self) -> None:
        """No new run once the command was interrupted."""
        if self.signum:
            raise Interrupted(self.signum)


_INTERRUPT = _Interruption()


def interrupted() -> int:
    """The signal that interrupted this command (0: none)."""
    return _INTERRUPT.signum


@contextmanager
def interruptible() -> Iterator[None]:
    """While active (the whole command), SIGINT and SIGTERM stop the command's run as a whole
    (see INTERRUPT_SIGNALS) instead of killing this process alone; outside a run they raise
    Interrupted. Only the main thread can set signal handlers: elsewhere this does nothing."""
    import threading

    if threading.current_thread() is not threading.main_thread():
        yield
        return
    _INTERRUPT.reset()
    before = {s: signal.signal(s, _INTERRUPT.handle) for s in INTERRUPT_SIGNALS}
    try:
        yield
    finally:
        for s, handler in before.items():
            signal.signal(s, handler)


def _run_marker(ident: str) -> str:
    return f"{os.getpid()}:{ident}"


def _marked(proc: Any, prefix: str) -> bool:
    import psutil

    try:
        return str(proc.environ().get(RUN_MARKER_ENV, "")).startswith(prefix)
    except (psutil.Error, OSError):
        return False


def forward_to_runs(signum: int) -> bool:
    """Send `signum` to the process group of each run this process started (a child of it
    marked with RUN_MARKER_ENV, the leader of its own session); True when there was one."""
    import psutil

    sent = False
    for child in psutil.Process().children():
        if _marked(child, f"{os.getpid()}:"):
            try:
                os.killpg(os.getpgid(child.pid), signum)
                sent = True
            except ProcessLookupError:
                pass
    return sent


def end_run_processes(prefix: str | None = None, grace: float = 5.0) -> int:
    """End every process still carrying this command's run marker (SIGTERM, then SIGKILL after
    `grace` seconds) and wait for them; returns how many there were."""
    import psutil

    prefix = prefix or f"{os.getpid()}:"
    me = os.getpid()
    left = [p for p in psutil.process_iter() if p.pid != me and _marked(p, prefix)]
    for p in left:
        with suppress(psutil.Error):
            p.terminate()
    _, alive = psutil.wait_procs(left, timeout=grace)
    for p in alive:
        with suppress(psutil.Error):
            p.kill()
    psutil.wait_procs(alive, timeout=grace)
    return len(left)

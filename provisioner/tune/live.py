"""Kernel settings tune changes while it measures (THP's mode), and puts back when it ends.

A knob carried by the environment changes nothing on the host: the candidate's variables reach one
process. A knob of the kernel's (knobs.Knob.sysfs) is the machine's: tune writes the candidate's
value into its file before each measurement, the rule's before the rule's, and writes back what the
file said before the run's first change when the run ends, however it ends: its work done, the
budget spent, SIGINT, SIGTERM or a hang-up (the driver's `finally`). What it writes first is a
journal of those values (JOURNAL in tune's state directory), before the first change: a run killed
outright (SIGKILL, a lost machine) leaves it, and the next run puts the values back before it
measures anything, saying so.

Standard library only: this runs as root on the host, from the smoke zipapp.
"""

from __future__ import annotations

import errno
import json
import os
import re

JOURNAL = "live.json"


def current(text: str) -> str:
    """A sysfs choice file's value: the bracketed word of 'always [madvise] never', else the text."""
    m = re.search(r"\[([^\]]+)\]", text)
    return m.group(1) if m else text.strip()


class Live:
    """The kernel settings of one tune run on this host; ROOT prefixes every path (the tests' sysfs)."""

    def __init__(self, state_dir: str, root: str = ""):
        self.journal = os.path.join(state_dir, JOURNAL)
        self.root = root
        self.original: dict[str, str] = {}  # path -> its value before the run's first change

    def _path(self, path: str) -> str:
        return self.root + path

    def read(self, path: str) -> str:
        with open(self._path(path), encoding="ascii") as f:
            return current(f.read())

    def _write(self, path: str, value: str) -> None:
        with open(self._path(path), "w", encoding="ascii") as f:
            f.write(value)

    def unavailable(self, path: str) -> str | None:
        """Why PATH cannot be set here (None: it can): its value written back to it, a change of nothing."""
        try:
            self._write(path, self.read(path))
        except OSError as exc:
            where = "; a container's /sys is read-only" if exc.errno in (errno.EROFS, errno.EACCES, errno.EPERM) else ""
            return f"{path} cannot be written here ({exc.strerror or exc}{where}): not measured, the plan's value stays"
        return None

    def recover(self) -> list[str]:
        """Put back what the journal of a run that never ended says; what was put back, as sentences."""
        try:
            with open(self.journal, encoding="utf-8") as f:
                left = json.load(f)
        except FileNotFoundError:
            return []
        except (OSError, ValueError):
            left = {}
        said = []
        for path, value in sorted(left.items()):
            try:
                if self.read(path) != value:
                    self._write(path, value)
                said.append(f"{path} back to {value}, as it was before a tune run that did not end (its journal)")
            except OSError as exc:
                said.append(f"{path} could not be put back to {value}: {exc.strerror or exc}")
        os.unlink(self.journal)
        return said

    def set(self, settings: tuple[tuple[str, str], ...]) -> None:
        """Each (path, value) of SETTINGS written, the path's value before the run's first change journaled first."""
        for path, value in settings:
            if path not in self.original:
                self.original[path] = self.read(path)
                self._save()
            if self.read(path) != value:
                self._write(path, value)

    def restore(self) -> list[str]:
        """Every changed path back to its value before the run; the journal removed once they all are."""
        said, failed = [], False
        for path, value in sorted(self.original.items()):
            try:
                if self.read(path) != value:
                    self._write(path, value)
                said.append(f"{path} back to {value}")
            except OSError as exc:
                failed = True
                said.append(f"{path} could not be put back to {value}: {exc.strerror or exc} (the journal keeps it)")
        if not failed:
            self.original.clear()
            if os.path.exists(self.journal):
                os.unlink(self.journal)
        return said

    def _save(self) -> None:
        os.makedirs(os.path.dirname(self.journal), mode=0o700, exist_ok=True)
        partial = self.journal + ".new"
        with open(partial, "w", encoding="utf-8") as f:
            json.dump(self.original, f)
            f.flush()
            os.fsync(f.fileno())
        os.replace(partial, self.journal)

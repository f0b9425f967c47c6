"""Kernel settings tune changes while it measures (THP's mode and defrag policy), and puts back when it ends.

A knob carried by the environment changes nothing on the host: the candidate's variables reach one
process. A knob of the kernel's (knobs.Knob.sysfs) is the machine's: tune writes the candidate's
value into its file before each measurement, the rule's before the rule's, and writes back what the
file said before the run's first change when the run ends, however it ends: its work done, the
budget spent, SIGINT, SIGTERM or a hang-up (the driver's `finally`). What it writes first is a
journal of those values and of every value it is about to write (JOURNAL in tune's state
directory): a run killed outright (SIGKILL, a lost machine) leaves it, and the next run puts the
values back before it measures anything, saying so, where the file still shows a value the killed
run wrote (one it never wrote was set since, by `provisioner up` or a person, and stays).

Standard library only: this runs as root on the host, from the smoke zipapp.
"""

from __future__ import annotations

import errno
import json
import os

from ..smoke.target.probe import bracketed

JOURNAL = "live.json"


def current(text: str) -> str:
    """A sysfs choice file's value: the bracketed word of 'always [madvise] never', else the text."""
    return bracketed(text) or text.strip()


class Live:
    """The kernel settings of one tune run on this host; ROOT prefixes every path (the tests' sysfs)."""

    def __init__(self, state_dir: str, root: str = ""):
        self.journal = os.path.join(state_dir, JOURNAL)
        self.root = root
        self.original: dict[str, str] = {}  # path -> its value before the run's first change
        self.written: dict[str, list[str]] = {}  # path -> every value the run wrote there

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
        """Put back what the journal of a run that never ended says, where the file still shows a
        value that run wrote (a value it never wrote was set since: `provisioner up`, undo, a
        person, and stays); what was done, as sentences. A value it could not put back stays in the
        journal, and this run's end tries again."""
        try:
            with open(self.journal, encoding="utf-8") as f:
                left = json.load(f)
        except FileNotFoundError:
            return []
        except (OSError, ValueError) as exc:
            os.unlink(self.journal)
            return [f"the journal {self.journal} of a run that did not end could not be read ({exc}): removed, nothing put back"]
        said = []
        for path, entry in sorted(left.items()):
            original, written = entry["original"], entry["written"]
            try:
                now = self.read(path)
                if now in written and now != original:
                    self._write(path, original)
                    said.append(f"{path} back to {original}, as it was before a tune run that did not end (its journal)")
                elif now != original:
                    said.append(f"{path} left at {now}: set since the tune run that did not end (its journal named {original})")
            except OSError as exc:
                self.original[path], self.written[path] = original, list(written)
                said.append(f"{path} could not be put back to {original}: {exc.strerror or exc} (the journal keeps it)")
        if self.original:
            self._save()
        else:
            os.unlink(self.journal)
        return said

    def set(self, settings: tuple[tuple[str, str], ...]) -> None:
        """Each (path, value) of SETTINGS written; the journal, saved before the write, names the
        path's value before the run's first change and every value the run writes there."""
        for path, value in settings:
            if path not in self.original:
                self.original[path] = self.read(path)
                self.written[path] = []
            if self.read(path) != value:
                if value not in self.written[path]:
                    self.written[path].append(value)
                    self._save()
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
            self.written.clear()
            if os.path.exists(self.journal):
                os.unlink(self.journal)
        return said

    def _save(self) -> None:
        os.makedirs(os.path.dirname(self.journal), mode=0o700, exist_ok=True)
        partial = self.journal + ".new"
        entries = {path: {"original": value, "written": self.written.get(path, [])} for path, value in self.original.items()}
        with open(partial, "w", encoding="utf-8") as f:
            json.dump(entries, f)
            f.flush()
            os.fsync(f.fileno())
        os.replace(partial, self.journal)

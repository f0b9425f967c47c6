"""Files of a fake root (/proc, /sys, /dev below a test's directory) for the tests of the modules
that read them there (``root`` other than "/")."""

from __future__ import annotations

from pathlib import Path


def write(root: Path, path: str, text: str = "") -> None:
    """ROOT/PATH holds TEXT (its directories made as needed)."""
    target = root / path.lstrip("/")
    target.parent.mkdir(parents=True, exist_ok=True)
    target.write_text(text)

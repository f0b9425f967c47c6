"""Choice lists, limits and forbidden paths the plan shares with the roles and modules.

The one source is plugins/module_utils/provisioner_constants.py (the modules carry it to the
targets, the roles' filter ``provisioner_constant`` reads it on the controller); this module
loads that file by path (provisioner.module_utils), so the control node holds no second copy.
"""

from __future__ import annotations

from types import ModuleType

from . import paths
from .module_utils import load

SOURCE = paths.PLUGINS / "module_utils" / "provisioner_constants.py"

_source = load("provisioner_constants")


def source() -> ModuleType:
    """The constants module itself (the roles' filter provisioner_constant looks names up in it)."""
    return _source


THP_CHOICES: tuple[str, ...] = _source.THP_CHOICES
THP_DEFRAG_CHOICES: tuple[str, ...] = _source.THP_DEFRAG_CHOICES
HUGEPAGES_SIZES: tuple[str, ...] = _source.HUGEPAGES_SIZES
HUGEPAGE_KIB: dict[str, int] = _source.HUGEPAGE_KIB
MAX_HUGEPAGES_SHARE: float = _source.MAX_HUGEPAGES_SHARE
TUNED_PROFILES: tuple[str, ...] = _source.TUNED_PROFILES
APPLY_LIVE_MODES: tuple[str, ...] = _source.APPLY_LIVE_MODES
STORAGE_LEVELS: tuple[str, ...] = _source.STORAGE_LEVELS
STORAGE_BACKENDS: tuple[str, ...] = _source.STORAGE_BACKENDS
MIN_DRIVES: dict[str, int] = _source.MIN_DRIVES
MD_CHUNK_KB: int = _source.MD_CHUNK_KB
READ_AHEAD_KB: int = _source.READ_AHEAD_KB
SYSTEM_MOUNTPOINTS: tuple[str, ...] = _source.SYSTEM_MOUNTPOINTS
SYSTEM_DIRECTORIES: tuple[str, ...] = _source.SYSTEM_DIRECTORIES
HUGETLBFS_REFUSED: tuple[str, ...] = _source.HUGETLBFS_REFUSED
VENV_REFUSED: tuple[str, ...] = _source.VENV_REFUSED
SERVING_MEMORY_SHARE: float = _source.SERVING_MEMORY_SHARE
MAX_SERVING_MEMORY_SHARE: float = _source.MAX_SERVING_MEMORY_SHARE
SERVING_WORKER_OVERHEAD_BYTES: int = _source.SERVING_WORKER_OVERHEAD_BYTES
SERVING_ALLOCATORS: tuple[str, ...] = _source.SERVING_ALLOCATORS
SERVING_TEMPLATE_UNIT: str = _source.SERVING_TEMPLATE_UNIT

# Copyright: provisioner contributors
# Apache License 2.0 (see pyproject.toml)
"""The one source of every choice list, limit and forbidden path that more than one place needs.

Readers: the modules (on the target, through module_utils), the filter ``provisioner_constant``
(role tasks and vars on the controller), and ``provisioner.constants`` (the plan, loaded from
this file). YAML that must hold literal lists (meta/argument_specs.yml ``choices``, the
modules' DOCUMENTATION) keeps them; tests/unit/test_constants.py fails when one disagrees.
Plain literals only: this file is executed, never imported as a package.
"""

from __future__ import annotations

# Transparent huge pages modes the plan and cpu_tuning set (kernel transhuge docs).
THP_CHOICES = ("madvise", "always", "never")
# Their defrag policies: which faults stall for compaction to get a huge page (the same docs).
THP_DEFRAG_CHOICES = ("madvise", "always", "defer", "defer+madvise", "never")

# Explicit hugepage sizes and their size in KiB; the largest share of RAM a reservation may take.
HUGEPAGES_SIZES = ("2M", "1G")
HUGEPAGE_KIB = {"2M": 2048, "1G": 1048576}
MAX_HUGEPAGES_SHARE = 0.9

# tuned profiles the generated profile may include.
TUNED_PROFILES = ("throughput-performance", "hpc-compute", "latency-performance")

# Live kernel values: auto (where writable), true (fail where read-only), false (persist only).
APPLY_LIVE_MODES = ("auto", "true", "false")

# The data array: RAID levels, backends, the fewest drives per level, md chunk and read-ahead.
STORAGE_LEVELS = ("raid0", "raid1", "raid10", "single")
STORAGE_BACKENDS = ("mdadm", "btrfs")
MIN_DRIVES = {"raid0": 2, "raid1": 2, "raid10": 4, "single": 1}
MD_CHUNK_KB = 512
READ_AHEAD_KB = 4096

# Mounts that make a drive the system's own: never proposed, never built on.
SYSTEM_MOUNTPOINTS = ("/", "/boot", "/boot/efi", "/usr", "/var")

# Directories that are never a mount point of ours (data array, hugetlbfs).
SYSTEM_DIRECTORIES = (*SYSTEM_MOUNTPOINTS, "/etc", "/home", "/tmp", "/root", "/proc", "/sys", "/dev", "/run")

# ... nor the hugetlbfs of the ML group: systemd mounts its own at /dev/hugepages.
HUGETLBFS_REFUSED = (*SYSTEM_DIRECTORIES, "/dev/hugepages")

# ... nor the ML environment, which also keeps out of the shared software trees.
VENV_REFUSED = (*SYSTEM_DIRECTORIES, "/usr/local", "/opt", "/srv")

# Serving (roles/serving, the plan's serving section): the share of RAM (after hugepages) the
# model server may use by default and at most, and what one worker costs before any model is
# loaded (Python, numpy, the GBDT libraries and the HTTP stack).
SERVING_MEMORY_SHARE = 0.5
MAX_SERVING_MEMORY_SHARE = 0.9
SERVING_WORKER_OVERHEAD_BYTES = 512 * 1024**2
# The allocators the model server's workers may run with (plan_serving_allocator): glibc's malloc,
# or jemalloc preloaded through role allocator's drop-in (Debian's libjemalloc2).
SERVING_ALLOCATORS = ("glibc", "jemalloc")
# The model server's worker template (roles/serving); roles allocator and mlstack add the
# serving pieces they own to their own lists when a host serves, so no play undoes another.
SERVING_TEMPLATE_UNIT = "provisioner-serve@.service"

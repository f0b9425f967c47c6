"""The tuning plan: pure functions from hardware facts to settings, each with its reason.

Input: the ``provisioner_hardware`` facts (schema 1, gathered on the target by
plugins/modules/provisioner_facts.py) and :class:`PlanOptions` (the ``plan_*`` variables).
Output: a :class:`Plan`; its ``to_dict()`` is what the CLI prints and what the roles receive
as the ``provisioner_plan`` fact (they read ``values``).  No I/O here.

Every rule, its reason and its source are written out in docs/tuning.md; each function cites
its section, and each setting's reason names the same source in one line.  One module per
concern; each imports only ``base`` and ``options`` below it, and ``derive`` imports them all:

- ``base``: Setting, Plan, PlanError and reading the facts, the RAM among them (docs/tuning.md, 'Memory');
- ``options``: PlanOptions, the ``plan_*`` variables read and validated;
- ``threads``: threads per job, trials, the other runtimes' pools, the DataLoader (docs/tuning.md, 'Threads');
- ``memory``: the feature matrix, THP, hugepages, reboots (docs/tuning.md, 'Memory', 'Hugepages' and 'Reboots');
- ``system``: clocks, the tuned profile, NUMA balancing, BLAS (docs/tuning.md, 'CPU frequency' and 'Runtimes');
- ``storage``: the proposal for the data array (docs/tuning.md, 'Storage');
- ``serving``: model-server workers, their cores and memory (docs/tuning.md, 'Serving');
- ``ray``: a Ray node's CPUs and memory (docs/ray.md, 'Sizing');
- ``derive``: every concern in order, :func:`derive_plan`.

Callers import from the package.  A test that replaces a function or constant patches it in the
module that uses it (``provisioner.plan.serving``, say): the name here is only a re-export.
"""

from provisioner.constants import (
    HUGEPAGES_SIZES,
    MAX_HUGEPAGES_SHARE,
    MAX_SERVING_MEMORY_SHARE,
    MD_CHUNK_KB,
    MIN_DRIVES,
    READ_AHEAD_KB,
    SERVING_MEMORY_SHARE,
    SERVING_WORKER_OVERHEAD_BYTES,
    STORAGE_BACKENDS,
    STORAGE_LEVELS,
    SYSTEM_DIRECTORIES,
    THP_CHOICES,
    THP_DEFRAG_CHOICES,
    TUNED_PROFILES,
)
from provisioner.plan.base import FACTS_SCHEMA, GIB, Plan, PlanError, Setting, check_facts
from provisioner.plan.derive import CONCERNS, derive_plan
from provisioner.plan.memory import (
    FEATURE_MATRIX_MARGIN_MIN_BYTES,
    FEATURE_MATRIX_MARGIN_SHARE,
    FLOAT32_BYTES,
    plan_feature_matrix,
    plan_hugepages,
    plan_reboot,
    plan_thp,
)
from provisioner.plan.options import (
    FEATURE_MATRIX_FEATURES,
    MAX_RAY_OBJECT_STORE_SHARE,
    RAY_OBJECT_STORE_SHARE,
    PlanOptions,
)
from provisioner.plan.ray import RAY_MIN_OBJECT_STORE_BYTES, RAY_SYSTEM_MIN_BYTES, RAY_SYSTEM_SHARE, plan_ray
from provisioner.plan.serving import core_cpus, plan_serving, serving_threads_per_worker
from provisioner.plan.storage import exclusion_reason, plan_storage, stable_id
from provisioner.plan.system import TUNED_REASONS, numa_balancing, plan_cpufreq, plan_os, plan_runtimes
from provisioner.plan.threads import ARROW_IO_THREADS, dataloader_split, plan_dataloader, plan_runtime_threads, plan_threads

__all__ = [
    "ARROW_IO_THREADS",
    "CONCERNS",
    "FACTS_SCHEMA",
    "FEATURE_MATRIX_FEATURES",
    "FEATURE_MATRIX_MARGIN_MIN_BYTES",
    "FEATURE_MATRIX_MARGIN_SHARE",
    "FLOAT32_BYTES",
    "GIB",
    "HUGEPAGES_SIZES",
    "MAX_HUGEPAGES_SHARE",
    "MAX_RAY_OBJECT_STORE_SHARE",
    "MAX_SERVING_MEMORY_SHARE",
    "MD_CHUNK_KB",
    "MIN_DRIVES",
    "RAY_MIN_OBJECT_STORE_BYTES",
    "RAY_OBJECT_STORE_SHARE",
    "RAY_SYSTEM_MIN_BYTES",
    "RAY_SYSTEM_SHARE",
    "READ_AHEAD_KB",
    "SERVING_MEMORY_SHARE",
    "SERVING_WORKER_OVERHEAD_BYTES",
    "STORAGE_BACKENDS",
    "STORAGE_LEVELS",
    "SYSTEM_DIRECTORIES",
    "THP_CHOICES",
    "THP_DEFRAG_CHOICES",
    "TUNED_PROFILES",
    "TUNED_REASONS",
    "Plan",
    "PlanError",
    "PlanOptions",
    "Setting",
    "check_facts",
    "core_cpus",
    "dataloader_split",
    "derive_plan",
    "exclusion_reason",
    "numa_balancing",
    "plan_cpufreq",
    "plan_dataloader",
    "plan_feature_matrix",
    "plan_hugepages",
    "plan_os",
    "plan_ray",
    "plan_reboot",
    "plan_runtime_threads",
    "plan_runtimes",
    "plan_serving",
    "plan_storage",
    "plan_thp",
    "plan_threads",
    "serving_threads_per_worker",
    "stable_id",
]

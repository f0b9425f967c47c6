"""Memory: the largest feature matrix, transparent huge pages, explicit hugepages and what needs a
reboot (docs/tuning.md, 'Memory', 'Transparent huge pages', 'Hugepages' and 'Reboots')."""

from __future__ import annotations

from collections.abc import Mapping
from typing import Any

from provisioner.constants import MAX_HUGEPAGES_SHARE
from provisioner.plan.base import GIB, PlanError, Setting, _get, _gib, _memory_and_hugepages, _ram
from provisioner.plan.options import FEATURE_MATRIX_FEATURES, PlanOptions

FLOAT32_BYTES = 4
# RAM kept free next to the largest feature matrix: a share of the RAM left after hugepages, and
# at least a floor (the kernel, the page cache of the data being read, the process itself).
FEATURE_MATRIX_MARGIN_SHARE = 0.2
FEATURE_MATRIX_MARGIN_MIN_BYTES = 2 * GIB


def plan_feature_matrix(
    facts: Mapping[str, Any], options: PlanOptions, settings: list[Setting], warnings: list[str]
) -> list[Setting]:
    """The largest float32 feature matrix this host holds in RAM without swapping.
    See docs/tuning.md, 'Memory' ('Feature matrix')."""
    total, reserved = _memory_and_hugepages(facts, settings, "the feature matrix")
    after = total - reserved
    margin = max(FEATURE_MATRIX_MARGIN_MIN_BYTES, int(after * FEATURE_MATRIX_MARGIN_SHARE))
    budget = after - margin
    features = options.feature_matrix_features
    row_bytes = features * FLOAT32_BYTES
    largest = max(0, budget) // row_bytes
    ram = f"{_gib(total)} RAM" + (f" - {_gib(reserved)} hugepages" if reserved else "")
    limit = (
        f"{_gib(max(budget, 0))} ({ram} - a margin of {_gib(margin)}: "
        f"{FEATURE_MATRIX_MARGIN_SHARE:.0%}, at least {_gib(FEATURE_MATRIX_MARGIN_MIN_BYTES)})"
    )
    if largest < 1:
        raise PlanError(
            f"no float32 row of {features} features fits in {limit}; lower plan_hugepages_count or plan_hugepages_share"
        )
    if options.feature_matrix_rows is not None:
        rows = options.feature_matrix_rows
        if rows > largest:
            raise PlanError(
                f"plan_feature_matrix_rows={rows} x {features} features x 4 B = {_gib(rows * row_bytes)} does not "
                f"fit in the {limit} this host holds without swapping (at most {largest} rows); lower "
                "plan_feature_matrix_rows or plan_feature_matrix_features"
            )
        rows_reason = f"{rows}: plan_feature_matrix_rows, {rows * row_bytes / max(budget, 1):.0%} of {limit}"
    else:
        rows = largest
        rows_reason = f"{rows}: the most rows of {features} float32 features that fit in {limit}"
    return [
        Setting("feature_matrix_rows", rows, rows_reason + "; the rest stays for the kernel, page cache and the process"),
        Setting(
            "feature_matrix_features",
            features,
            f"{features}: plan_feature_matrix_features" + (" (default)" if features == FEATURE_MATRIX_FEATURES else ""),
        ),
        Setting(
            "feature_matrix_bytes",
            rows * row_bytes,
            f"{rows * row_bytes}: {rows} rows x {features} features x 4 B = {_gib(rows * row_bytes)} "
            "(one copy; a library that copies it needs room for two)",
        ),
    ]


def plan_thp(facts: Mapping[str, Any], options: PlanOptions, warnings: list[str]) -> list[Setting]:
    """Transparent huge pages.  See docs/tuning.md, 'Transparent huge pages'."""
    reasons = {
        "madvise": "madvise: numpy asks for huge pages on arrays >= 4 MB (madvise); always can bloat "
        "memory (kernel transhuge docs; pytorch PR 115990)",
        "always": "always: plan_thp=always, for a dedicated box; every anonymous region gets huge pages, "
        "which can bloat memory (kernel transhuge docs)",
        "never": "never: plan_thp=never; numpy and torch lose huge pages on large arrays (kernel transhuge docs)",
    }
    if options.tuned_profile == "hpc-compute" and options.thp != "always":
        warnings.append(
            f"tuned profile hpc-compute sets THP=always; the plan keeps plan_thp={options.thp} "
            "(set plan_thp: always to follow the profile)"
        )
    current = _get(facts, "thp.enabled")
    absent = "; the kernel shows no THP controls, so this is not applicable there" if current is None else ""
    return [
        Setting("thp_enabled", options.thp, reasons[options.thp] + absent),
        Setting("thp_defrag", options.thp_defrag, DEFRAG_REASONS[options.thp_defrag] + absent),
    ]


# What a page fault does when no huge page is free, per defrag policy (kernel transhuge docs).
DEFRAG_REASONS = {
    "madvise": "madvise: only regions that asked for huge pages stall for compaction (kernel transhuge docs)",
    "always": "always: plan_thp_defrag=always; every fault that wants a huge page stalls for compaction, "
    "which can cost latency (kernel transhuge docs)",
    "defer": "defer: plan_thp_defrag=defer; no fault stalls, kswapd and kcompactd make huge pages in the "
    "background for khugepaged (kernel transhuge docs)",
    "defer+madvise": "defer+madvise: plan_thp_defrag=defer+madvise; regions that asked stall, the others "
    "defer to the background (kernel transhuge docs)",
    "never": "never: plan_thp_defrag=never; no fault stalls, a huge page only where one is free (kernel transhuge docs)",
}


def plan_hugepages(facts: Mapping[str, Any], options: PlanOptions, warnings: list[str]) -> list[Setting]:
    """Explicit hugepages (2M at run time, 1G on the kernel command line).  See docs/tuning.md, 'Hugepages'."""
    none_reason = (
        "0: no named consumer uses hugetlbfs; numpy and torch use anonymous memory (THP), and reserved "
        "pages are lost to everything else (RHEL performance tuning guide)"
    )
    pages_2m = Setting("hugepages_2m", 0, none_reason)
    pages_1g = Setting("hugepages_1g", 0, none_reason)
    size = options.hugepages_size
    if size is None or not (options.hugepages_count or options.hugepages_share):
        if size is not None:
            warnings.append(f"plan_hugepages_size={size} without plan_hugepages_count or _share reserves nothing")
        return [pages_2m, pages_1g]

    total = _ram(facts)
    if not isinstance(total, int) or total <= 0:
        raise PlanError("hardware facts report no memory size; cannot size hugepages")
    page_bytes = 2 * 1024**2 if size == "2M" else GIB
    if size == "1G" and not _get(facts, "memory.hugepages_1g_supported", False):
        raise PlanError("plan_hugepages_size=1G but this CPU/kernel has no 1 GiB pages (no pdpe1gb); use 2M")
    if options.hugepages_count:
        count = options.hugepages_count
        how = f"plan_hugepages_count={count}"
    else:
        count = int(total * options.hugepages_share // page_bytes)
        how = f"plan_hugepages_share={options.hugepages_share:g} of {_gib(total)}"
    reserved = count * page_bytes
    if reserved > MAX_HUGEPAGES_SHARE * total:
        raise PlanError(
            f"plan_hugepages: {count} x {size} = {_gib(reserved)} is more than "
            f"{MAX_HUGEPAGES_SHARE:.0%} of the {_gib(total)} of RAM; lower the count or share"
        )
    reason = f"{count}: {how} = {_gib(reserved)} reserved for hugetlbfs consumers, lost to everything else"
    if size == "2M":
        pages_2m = Setting("hugepages_2m", count, reason + " (vm.nr_hugepages, at run time)")
    else:
        pages_1g = Setting(
            "hugepages_1g",
            count,
            reason + "; 1 GiB pages are reserved on the kernel command line only, so this needs a "
            "reboot (kernel hugetlbpage docs)",
        )
    if reserved > 0.5 * total:
        warnings.append(f"hugepages reserve {_gib(reserved)} of {_gib(total)} RAM; numpy/torch cannot use it")
    return [pages_2m, pages_1g]


def plan_reboot(settings: list[Setting]) -> Setting:
    """What needs a reboot to take effect; the roles report it and never reboot on their own.
    See docs/tuning.md, 'Reboots'."""
    needs = [s.key for s in settings if s.key == "hugepages_1g" and s.value]
    if needs:
        return Setting("reboot_required_for", needs, f"{', '.join(needs)}: kernel command line only")
    return Setting("reboot_required_for", [], "nothing in this plan needs a reboot")

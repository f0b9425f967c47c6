"""The tuning plan: each rule, its reason, each refusal, the storage proposal."""

from __future__ import annotations

import copy
import json
import re
from pathlib import Path

import pytest
from facts_fixtures import load

from provisioner.errors import BadInput, ExitCode
from provisioner.plan import (
    Plan,
    PlanError,
    PlanOptions,
    Setting,
    derive_plan,
    exclusion_reason,
    stable_id,
)

MACHINES = ("epyc_4545p", "xeon_2s", "vm_2vcpu", "laptop_4c")
REQUIRED_KEYS = {
    "threads_per_job",
    "trials",
    "threads_per_trial",
    "thp_enabled",
    "thp_defrag",
    "hugepages_2m",
    "hugepages_1g",
    "reboot_required_for",
    "cpu_governor",
    "energy_performance_preference",
    "tuned_profile",
    "swappiness",
    "numa_balancing",
    "blas",
    "openmp_runtime",
    "kmp_blocktime",
}


@pytest.fixture(params=MACHINES)
def facts(request) -> dict:
    return load(request.param)


@pytest.fixture
def epyc() -> dict:
    return load("epyc_4545p")


@pytest.fixture
def xeon() -> dict:
    return load("xeon_2s")


@pytest.fixture
def vm() -> dict:
    return load("vm_2vcpu")


@pytest.fixture
def laptop() -> dict:
    return load("laptop_4c")


# --------------------------------------------------------------------------
# shape
# --------------------------------------------------------------------------


def test_every_setting_has_a_reason(facts):
    plan = derive_plan(facts, PlanOptions())
    assert set(plan.keys()) >= REQUIRED_KEYS
    assert len(plan.keys()) == len(set(plan.keys())), "a key appears twice"
    for setting in plan.settings:
        assert isinstance(setting.reason, str) and len(setting.reason) > 10, setting
        assert "\n" not in setting.reason


def test_to_dict_round_trip(facts):
    plan = derive_plan(facts, PlanOptions())
    data = plan.to_dict()
    assert set(data) == {"settings", "values", "storage", "serving", "warnings"}
    assert data["values"] == {s["key"]: s["value"] for s in data["settings"]}
    assert all(set(s) == {"key", "value", "reason"} for s in data["settings"])
    json.dumps(data)  # JSON-clean: it travels as an Ansible fact
    again = Plan.from_dict(json.loads(json.dumps(data)))
    assert again.to_dict() == data
    assert again.value("trials") == plan.value("trials")


def test_value_of_unknown_key_names_the_known_ones(epyc):
    plan = derive_plan(epyc, PlanOptions())
    with pytest.raises(KeyError, match="threads_per_job"):
        plan.value("no_such_key")


def test_setting_is_a_plain_dataclass():
    assert Setting("k", 1, "r").to_dict() == {"key": "k", "value": 1, "reason": "r"}


def test_plan_error_is_bad_input():
    assert issubclass(PlanError, BadInput)
    assert PlanError("x").exit_code == ExitCode.BAD_INPUT


def test_derive_plan_does_not_change_the_facts(epyc):
    before = copy.deepcopy(epyc)
    derive_plan(epyc, PlanOptions(trials=4))
    assert epyc == before


# --------------------------------------------------------------------------
# threads
# --------------------------------------------------------------------------


def test_threads_per_job_is_physical_cores_smt_ignored(epyc):
    plan = derive_plan(epyc, PlanOptions())
    assert plan.value("threads_per_job") == 16
    reason = plan.reason("threads_per_job")
    assert reason.startswith("16: 16 physical cores, SMT ignored")
    assert "BLAS/GBDT" in reason


def test_threads_per_job_on_each_machine():
    expected = {"epyc_4545p": 16, "xeon_2s": 64, "vm_2vcpu": 2, "laptop_4c": 4}
    for name, cores in expected.items():
        assert derive_plan(load(name), PlanOptions()).value("threads_per_job") == cores, name


def test_vm_without_smt_says_so(vm):
    plan = derive_plan(vm, PlanOptions())
    assert plan.value("threads_per_job") == 2
    assert "no SMT" in plan.reason("threads_per_job")


def test_trials_default_to_one_per_core(epyc):
    plan = derive_plan(epyc, PlanOptions())
    assert plan.value("trials") == 16
    assert plan.value("threads_per_trial") == 1
    assert "default" in plan.reason("trials")


@pytest.mark.parametrize(("trials", "per_trial"), [(1, 16), (2, 8), (4, 4), (5, 3), (16, 1)])
def test_threads_per_trial_is_cores_divided_by_trials(epyc, trials, per_trial):
    plan = derive_plan(epyc, PlanOptions(trials=trials))
    assert plan.value("trials") == trials
    assert plan.value("threads_per_trial") == per_trial
    assert f"16 cores // {trials} trials" in plan.reason("threads_per_trial")


def test_uneven_split_names_the_idle_cores(epyc):
    plan = derive_plan(epyc, PlanOptions(trials=5))
    assert "1 core(s) left" in plan.reason("threads_per_trial")


def test_trials_above_cores_are_refused_naming_the_option(epyc):
    with pytest.raises(PlanError, match="plan_allow_oversubscription") as info:
        derive_plan(epyc, PlanOptions(trials=17))
    message = str(info.value)
    assert "17" in message and "16 physical cores" in message
    assert "\n" not in message


def test_oversubscription_when_allowed_warns(epyc):
    plan = derive_plan(epyc, PlanOptions(trials=32, allow_oversubscription=True))
    assert plan.value("trials") == 32
    assert plan.value("threads_per_trial") == 1
    assert "plan_allow_oversubscription" in plan.reason("trials")
    assert any("oversubscribed" in w for w in plan.warnings)


@pytest.mark.parametrize("trials", [0, -1])
def test_trials_below_one_are_refused(trials):
    with pytest.raises(PlanError, match="plan_trials must be 1 or more"):
        PlanOptions(trials=trials)


# Options out of their range, as the inventory gives them: each refused naming itself and its bounds.
@pytest.mark.parametrize(
    ("variables", "message"),
    [
        ({"plan_serving_workers": 0}, "plan_serving_workers must be 1 or more"),
        ({"plan_serving_threads_per_worker": "-1"}, "plan_serving_threads_per_worker must be 1 or more"),
        ({"plan_serving_memory_share": 0.95}, "plan_serving_memory_share must be above 0 and at most 0.9"),
        ({"plan_serving_memory_share": 0}, "plan_serving_memory_share must be above 0"),
        ({"plan_serving_allocator": "tcmalloc"}, "plan_serving_allocator must be one of glibc, jemalloc"),
        ({"plan_ray_object_store_share": 0.7}, "plan_ray_object_store_share must be above 0 and at most 0.6"),
        ({"plan_ray_object_store_share": 0}, "plan_ray_object_store_share must be above 0"),
    ],
)
def test_options_out_of_range_are_refused_naming_their_bounds(variables, message):
    with pytest.raises(PlanError, match=message):
        PlanOptions.from_vars(variables)


@pytest.mark.parametrize(("cores", "threads"), [(0, 2), (2, 0), (None, 2)])
def test_facts_without_cores_or_threads_are_refused(vm, cores, threads):
    vm["cpu"]["cores"] = cores
    vm["cpu"]["threads"] = threads
    with pytest.raises(PlanError, match=r"physical cores|logical CPUs"):
        derive_plan(vm, PlanOptions())


def test_affinity_below_threads_warns(epyc):
    epyc["cpu"]["affinity_cpus"] = 4
    plan = derive_plan(epyc, PlanOptions())
    assert any("only 4 of 32 CPUs" in w for w in plan.warnings)


# --------------------------------------------------------------------------
# THP and hugepages
# --------------------------------------------------------------------------


def test_thp_default_is_madvise_with_reason(facts):
    plan = derive_plan(facts, PlanOptions())
    assert plan.value("thp_enabled") == "madvise"
    assert plan.value("thp_defrag") == "madvise"
    assert "numpy" in plan.reason("thp_enabled") and ">= 4 MB" in plan.reason("thp_enabled")


def test_a_kernel_without_thp_controls_keeps_both_values_and_says_so(facts):
    bare = {**facts, "thp": {}}
    plan = derive_plan(bare, PlanOptions(thp_defrag="defer"))
    assert (plan.value("thp_enabled"), plan.value("thp_defrag")) == ("madvise", "defer")
    for key in ("thp_enabled", "thp_defrag"):
        assert plan.reason(key).endswith("the kernel shows no THP controls, so this is not applicable there"), key


@pytest.mark.parametrize("mode", ["always", "never"])
def test_thp_other_modes(epyc, mode):
    plan = derive_plan(epyc, PlanOptions(thp=mode))
    assert plan.value("thp_enabled") == mode
    assert plan.reason("thp_enabled").startswith(f"{mode}: plan_thp={mode}")


@pytest.mark.parametrize("policy", ["always", "defer", "defer+madvise", "never"])
def test_thp_defrag_other_policies(epyc, policy):
    plan = derive_plan(epyc, PlanOptions.from_vars({"plan_thp_defrag": policy.upper()}))
    assert plan.value("thp_defrag") == policy
    assert plan.reason("thp_defrag").startswith(f"{policy}: plan_thp_defrag={policy}")
    assert plan.value("thp_enabled") == "madvise"  # the mode is its own option


def test_unknown_thp_value_is_refused():
    with pytest.raises(PlanError, match="plan_thp must be one of madvise, always, never"):
        PlanOptions(thp="sometimes")


def test_hpc_compute_with_madvise_warns(epyc):
    plan = derive_plan(epyc, PlanOptions(tuned_profile="hpc-compute"))
    assert any("hpc-compute sets THP=always" in w for w in plan.warnings)


def test_no_hugepages_by_default(facts):
    plan = derive_plan(facts, PlanOptions())
    assert plan.value("hugepages_2m") == 0
    assert plan.value("hugepages_1g") == 0
    assert "hugetlbfs" in plan.reason("hugepages_2m")
    assert plan.value("reboot_required_for") == []


def test_2m_hugepages_by_count(epyc):
    plan = derive_plan(epyc, PlanOptions(hugepages_size="2M", hugepages_count=1024))
    assert plan.value("hugepages_2m") == 1024
    assert plan.value("hugepages_1g") == 0
    assert "2.0 GiB" in plan.reason("hugepages_2m")
    assert plan.value("reboot_required_for") == []


def test_1g_hugepages_by_share_need_a_reboot(epyc):
    plan = derive_plan(epyc, PlanOptions(hugepages_size="1G", hugepages_share=0.5))
    total_gib = epyc["memory"]["total_bytes"] // 1024**3
    assert plan.value("hugepages_1g") == total_gib // 2
    assert plan.value("hugepages_2m") == 0
    assert "reboot" in plan.reason("hugepages_1g")
    assert plan.value("reboot_required_for") == ["hugepages_1g"]


def test_hugepages_beyond_90_percent_of_memory_are_refused(vm):
    with pytest.raises(PlanError, match=re.escape("more than 90% of the 23.5 GiB")):
        derive_plan(vm, PlanOptions(hugepages_size="1G", hugepages_count=23))


def test_hugepages_share_above_limit_is_refused():
    with pytest.raises(PlanError, match=re.escape("between 0 and 0.9")):
        PlanOptions(hugepages_size="2M", hugepages_share=0.95)


def test_1g_hugepages_without_cpu_support_are_refused(laptop):
    laptop["memory"]["hugepages_1g_supported"] = False
    with pytest.raises(PlanError, match="no 1 GiB pages"):
        derive_plan(laptop, PlanOptions(hugepages_size="1G", hugepages_count=1))


def test_hugepages_count_without_size_is_refused():
    with pytest.raises(PlanError, match="need plan_hugepages_size"):
        PlanOptions(hugepages_count=4)


def test_hugepages_count_and_share_together_are_refused():
    with pytest.raises(PlanError, match="not both"):
        PlanOptions(hugepages_size="2M", hugepages_count=4, hugepages_share=0.1)


# --------------------------------------------------------------------------
# cpufreq, tuned, OS
# --------------------------------------------------------------------------


def test_governor_and_epp_on_amd_pstate_epp(epyc):
    plan = derive_plan(epyc, PlanOptions())
    assert plan.value("cpu_governor") == "performance"
    assert "amd-pstate-epp" in plan.reason("cpu_governor")
    assert plan.value("energy_performance_preference") == "performance"
    assert plan.value("cpu_boost") is True


def test_governor_on_intel_pstate(xeon):
    plan = derive_plan(xeon, PlanOptions())
    assert plan.value("cpu_governor") == "performance"
    assert "intel_pstate" in plan.reason("cpu_governor")


def test_no_cpufreq_driver_is_not_applicable(vm):
    plan = derive_plan(vm, PlanOptions())
    assert plan.value("cpu_governor") is None
    assert plan.reason("cpu_governor").startswith("not applicable: no cpufreq driver")
    assert plan.value("energy_performance_preference") is None
    assert any("virtualized (kvm)" in w for w in plan.warnings)


def test_driver_without_epp(epyc):
    epyc["cpufreq"].update(driver="acpi-cpufreq", epp=None, available_epp=[])
    plan = derive_plan(epyc, PlanOptions())
    assert plan.value("cpu_governor") == "performance"
    assert plan.value("energy_performance_preference") is None
    assert "has no EPP" in plan.reason("energy_performance_preference")


def test_driver_without_performance_governor(epyc):
    epyc["cpufreq"]["available_governors"] = ["schedutil"]
    plan = derive_plan(epyc, PlanOptions())
    assert plan.value("cpu_governor") is None
    assert "no performance governor" in plan.reason("cpu_governor")


@pytest.mark.parametrize("profile", ["throughput-performance", "hpc-compute", "latency-performance"])
def test_tuned_profiles(epyc, profile):
    plan = derive_plan(epyc, PlanOptions(tuned_profile=profile))
    assert plan.value("tuned_profile") == profile
    assert "tuned" in plan.reason("tuned_profile")


def test_unknown_tuned_profile_is_refused():
    with pytest.raises(PlanError, match="plan_tuned_profile must be one of"):
        PlanOptions(tuned_profile="powersave")


def test_swappiness(facts):
    plan = derive_plan(facts, PlanOptions())
    assert plan.value("swappiness") == 10
    assert "resident" in plan.reason("swappiness")


def test_numa_balancing(epyc, xeon):
    assert derive_plan(epyc, PlanOptions()).value("numa_balancing") is None
    assert "1 NUMA node" in derive_plan(epyc, PlanOptions()).reason("numa_balancing")
    plan = derive_plan(xeon, PlanOptions())
    assert plan.value("numa_balancing") == 1
    assert "2 NUMA nodes" in plan.reason("numa_balancing")
    assert derive_plan(xeon, PlanOptions(tuned_profile="hpc-compute")).value("numa_balancing") == 0


# --------------------------------------------------------------------------
# runtimes
# --------------------------------------------------------------------------


def test_blas_on_amd_is_openblas_with_the_reason(epyc):
    plan = derive_plan(epyc, PlanOptions())
    assert plan.value("blas") == "openblas"
    reason = plan.reason("blas")
    assert "Zen 4 AVX-512" in reason
    assert "MKL_DEBUG_CPU_TYPE was removed in MKL 2020.1" in reason
    assert "MKL_ENABLE_INSTRUCTIONS does nothing on AMD" in reason


def test_blas_on_intel_is_mkl_for_torch_and_openblas_for_numpy(xeon):
    plan = derive_plan(xeon, PlanOptions())
    assert plan.value("blas") == "mkl"
    assert plan.value("blas_numpy") == "openblas"
    assert "torch bundles MKL" in plan.reason("blas")
    assert "numpy/scipy wheels" in plan.reason("blas")


def test_blas_on_other_vendors(epyc):
    epyc["cpu"]["vendor"] = "ARM"
    assert derive_plan(epyc, PlanOptions()).value("blas") == "openblas"


def test_one_openmp_runtime_and_no_kmp(facts):
    plan = derive_plan(facts, PlanOptions())
    assert plan.value("openmp_runtime") == "libgomp"
    assert plan.value("kmp_blocktime") is None
    assert "libiomp" in plan.reason("kmp_blocktime")
    assert plan.value("omp_proc_bind") is None


# --------------------------------------------------------------------------
# storage proposal
# --------------------------------------------------------------------------


def test_storage_proposes_the_two_unused_nvme_drives(epyc):
    storage = derive_plan(epyc, PlanOptions()).storage
    assert storage is not None
    assert storage["proposed"] is True
    assert storage["confirmed"] is False
    assert (storage["level"], storage["backend"], storage["filesystem"]) == ("raid0", "mdadm", "xfs")
    assert storage["chunk_kb"] == 512
    assert storage["mountpoint"] == "/data"
    assert "noatime" in storage["mount_options"] and "nofail" in storage["mount_options"]
    assert [d["name"] for d in storage["devices"]] == ["nvme1n1", "nvme2n1"]
    for device in storage["devices"]:
        assert device["id"].startswith("/dev/disk/by-id/"), device
    assert storage["usable_bytes"] == 2 * 3840755982336
    assert "proposal only" in storage["reason"]


def test_storage_never_proposes_the_root_disk(epyc):
    storage = derive_plan(epyc, PlanOptions()).storage
    assert storage is not None
    excluded = {e["name"]: e["reason"] for e in storage["excluded"]}
    assert excluded == {"nvme0n1": "root disk: holds /, /boot or /boot/efi"}
    assert "nvme0n1" not in [d["name"] for d in storage["devices"]]


def test_storage_excludes_a_drive_with_a_filesystem(xeon):
    storage = derive_plan(xeon, PlanOptions()).storage
    assert storage is not None
    excluded = {e["name"]: e["reason"] for e in storage["excluded"]}
    assert "xfs" in excluded["nvme2n1"] and "signature" in excluded["nvme2n1"]
    assert excluded["sda"].startswith("root disk")
    assert [d["name"] for d in storage["devices"]] == ["nvme0n1", "nvme1n1"]


@pytest.mark.parametrize(
    ("change", "expected"),
    [
        ({"mountpoints": ["/srv"], "mounted": True}, "mounted at /srv"),
        ({"partitions": ["nvme1n1p1"]}, "has partitions (nvme1n1p1)"),
        ({"holders": ["md127"], "signatures": ["linux_raid_member"]}, "in use by md127"),
        ({"signatures": ["LVM2_member"]}, "has a signature (LVM2_member)"),
        ({"removable": True}, "removable"),
        ({"nvme": False, "transport": "sata"}, "not NVMe"),
        ({"signature_probe": "failed"}, "could not be probed for signatures"),
    ],
)
def test_storage_exclusions(epyc, change, expected):
    epyc["block_devices"][1].update(change)
    storage = derive_plan(epyc, PlanOptions()).storage
    assert storage is not None
    excluded = {e["name"]: e["reason"] for e in storage["excluded"]}
    assert expected in excluded["nvme1n1"]
    assert storage["proposed"] is False
    assert "raid0 needs 2 drive(s), found 1" in storage["reason"]


def test_exclusion_reason_free_drive(epyc):
    assert exclusion_reason(epyc["block_devices"][1]) is None


def test_storage_raid1_and_single(epyc):
    raid1 = derive_plan(epyc, PlanOptions(storage_level="raid1")).storage
    assert raid1 is not None
    assert raid1["level"] == "raid1" and raid1["usable_bytes"] == 3840755982336
    single = derive_plan(epyc, PlanOptions(storage_level="single")).storage
    assert single is not None
    assert len(single["devices"]) == 1
    assert single["chunk_kb"] is None
    assert any(e["reason"] == "level single uses one drive" for e in single["excluded"])


def test_storage_raid10_needs_four_drives(epyc):
    storage = derive_plan(epyc, PlanOptions(storage_level="raid10")).storage
    assert storage is not None
    assert storage["proposed"] is False
    assert "raid10 needs 4" in storage["reason"]


def test_storage_btrfs(epyc):
    storage = derive_plan(epyc, PlanOptions(storage_backend="btrfs", storage_level="raid1")).storage
    assert storage is not None
    assert storage["filesystem"] == "btrfs"
    assert storage["metadata_profile"] == "raid1"
    assert storage["chunk_kb"] is None


def test_storage_mountpoint_option(epyc):
    storage = derive_plan(epyc, PlanOptions(data_mountpoint="/scratch")).storage
    assert storage is not None
    assert storage["mountpoint"] == "/scratch"


@pytest.mark.parametrize("mountpoint", ["data", "/", "/boot", "/usr"])
def test_bad_mountpoints_are_refused(mountpoint):
    with pytest.raises(PlanError, match="plan_data_mountpoint"):
        PlanOptions(data_mountpoint=mountpoint)


def test_unknown_storage_level_and_backend_are_refused():
    with pytest.raises(PlanError, match="plan_storage_level"):
        PlanOptions(storage_level="raid5")
    with pytest.raises(PlanError, match="plan_storage_backend"):
        PlanOptions(storage_backend="zfs")


def test_nothing_proposed_on_a_single_disk_machine(laptop, vm):
    for facts in (laptop, vm):
        storage = derive_plan(facts, PlanOptions()).storage
        assert storage is not None
        assert storage["proposed"] is False
        assert storage["devices"] == []
        assert storage["excluded"][0]["reason"].startswith("root disk")


def _loops(epyc: dict) -> dict:
    for index, name in enumerate(("loop0", "loop1")):
        epyc["block_devices"].append(
            {
                **epyc["block_devices"][1],
                "name": name,
                "path": f"/dev/{name}",
                "by_id": [],
                "nvme": False,
                "loop": True,
                "type": "loop",
                "size_bytes": 2 * 1024**3,
                "backing_file": f"/var/tmp/disk{index}.img",
            }
        )
    return epyc


def test_named_loop_devices_are_used_with_a_warning(epyc):
    plan = derive_plan(_loops(epyc), PlanOptions(storage_devices=("/dev/loop0", "loop1")))
    storage = plan.storage
    assert storage is not None
    assert storage["proposed"] is True
    assert [d["id"] for d in storage["devices"]] == ["/dev/loop0", "/dev/loop1"]
    assert any("no /dev/disk/by-id link" in w for w in plan.warnings)
    excluded = {e["name"]: e["reason"] for e in storage["excluded"]}
    assert excluded["nvme0n1"].startswith("root disk")  # the real reason wins
    assert excluded["nvme1n1"] == excluded["nvme2n1"] == "not in plan_storage_devices"
    assert "2 drive(s) from plan_storage_devices" in storage["reason"]


def test_unnamed_loop_devices_are_not_proposed(epyc):
    storage = derive_plan(_loops(epyc), PlanOptions()).storage
    assert storage is not None
    assert [d["name"] for d in storage["devices"]] == ["nvme1n1", "nvme2n1"]
    # Not listed either: loop devices come and go with other software, and the plan must not.
    assert not {"loop0", "loop1"} & {e["name"] for e in storage["excluded"]}


def test_named_drive_in_use_is_refused(epyc):
    with pytest.raises(PlanError, match="refusing /dev/nvme0n1: root disk"):
        derive_plan(epyc, PlanOptions(storage_devices=("/dev/nvme0n1", "/dev/nvme1n1")))
    with pytest.raises(PlanError, match="not a block device"):
        derive_plan(epyc, PlanOptions(storage_devices=("/dev/sdz",)))


def test_named_drive_by_id(epyc):
    wanted = epyc["block_devices"][2]["by_id"][1]
    storage = derive_plan(epyc, PlanOptions(storage_devices=(wanted,), storage_level="single")).storage
    assert storage is not None
    assert [d["name"] for d in storage["devices"]] == ["nvme2n1"]


def test_stable_id_prefers_by_id_then_path(epyc):
    assert stable_id(epyc["block_devices"][1]) == (epyc["block_devices"][1]["by_id"][0], True)
    assert stable_id({"name": "loop3", "path": "/dev/loop3", "by_id": []}) == ("/dev/loop3", False)


def test_mixed_drive_sizes_warn(epyc):
    epyc["block_devices"][2]["size_bytes"] = 7681501126656
    plan = derive_plan(epyc, PlanOptions())
    assert any("differ in size" in w for w in plan.warnings)
    assert plan.storage is not None
    assert plan.storage["usable_bytes"] == 2 * 3840755982336


# --------------------------------------------------------------------------
# options from variables
# --------------------------------------------------------------------------


def test_from_vars_reads_plan_keys_and_ignores_others():
    options = PlanOptions.from_vars(
        {
            "plan_trials": "8",
            "plan_allow_oversubscription": "yes",
            "plan_thp": "Always",
            "plan_hugepages_size": "2MiB",
            "plan_hugepages_count": 16,
            "plan_hugepages_share": 0,
            "plan_tuned_profile": "hpc-compute",
            "plan_data_mountpoint": "/scratch",
            "plan_storage_level": "RAID1",
            "plan_storage_backend": "btrfs",
            "plan_storage_devices": ["/dev/loop0", "/dev/loop1"],
            "inventory_hostname": "box1",
            "ansible_facts": {},
        }
    )
    assert options == PlanOptions(
        trials=8,
        allow_oversubscription=True,
        thp="always",
        hugepages_size="2M",
        hugepages_count=16,
        tuned_profile="hpc-compute",
        data_mountpoint="/scratch",
        storage_level="raid1",
        storage_backend="btrfs",
        storage_devices=("/dev/loop0", "/dev/loop1"),
    )


def test_from_vars_null_means_default():
    assert PlanOptions.from_vars({"plan_trials": None, "plan_hugepages_size": "", "plan_thp": None}) == PlanOptions()


def test_from_vars_refuses_unknown_plan_keys_naming_the_known_ones():
    with pytest.raises(PlanError) as info:
        PlanOptions.from_vars({"plan_trails": 8})
    message = str(info.value)
    assert "plan_trails" in message
    for known in PlanOptions.known_vars():
        assert known in message


@pytest.mark.parametrize(
    ("variables", "match"),
    [
        ({"plan_trials": "eight"}, "plan_trials must be a whole number"),
        ({"plan_trials": True}, "plan_trials must be a whole number"),
        ({"plan_trials": 0}, "plan_trials must be 1 or more"),
        ({"plan_allow_oversubscription": "maybe"}, "true or false"),
        ({"plan_hugepages_size": "4M"}, "plan_hugepages_size must be null, 2M or 1G"),
        ({"plan_hugepages_share": "lots"}, "plan_hugepages_share must be a number"),
        ({"plan_thp": "sometimes"}, "plan_thp must be one of"),
        ({"plan_thp_defrag": "often"}, "plan_thp_defrag must be one of madvise, always, defer, defer\\+madvise, never"),
        ({"plan_tuned_profile": "balanced"}, "plan_tuned_profile must be one of"),
        ({"plan_storage_devices": [1, 2]}, "list of device paths"),
    ],
)
def test_from_vars_refusals(variables, match):
    with pytest.raises(PlanError, match=match):
        PlanOptions.from_vars(variables)


def test_options_are_frozen():
    options = PlanOptions()
    with pytest.raises(AttributeError):
        options.trials = 3  # type: ignore[misc]


# --------------------------------------------------------------------------
# facts validation
# --------------------------------------------------------------------------


def test_missing_facts_are_refused():
    with pytest.raises(PlanError, match="no hardware facts"):
        derive_plan(None, PlanOptions())  # type: ignore[arg-type]


def test_wrong_schema_is_refused(epyc):
    epyc["schema"] = 2
    with pytest.raises(PlanError, match="schema 2"):
        derive_plan(epyc, PlanOptions())


def test_facts_without_cpu_are_refused(epyc):
    del epyc["cpu"]
    with pytest.raises(PlanError, match=re.escape("lack cpu.cores")):
        derive_plan(epyc, PlanOptions())


def test_plan_is_deterministic(facts):
    assert derive_plan(facts, PlanOptions()).to_dict() == derive_plan(copy.deepcopy(facts), PlanOptions()).to_dict()


# --------------------------------------------------------------------------
# the role's defaults and argument specs agree with PlanOptions
# --------------------------------------------------------------------------

ROLE = Path(__file__).resolve().parents[2] / "roles" / "plan"


def test_role_defaults_match_plan_options():
    import yaml

    defaults = yaml.safe_load((ROLE / "defaults" / "main.yml").read_text())
    assert set(defaults) == set(PlanOptions.known_vars())
    assert PlanOptions.from_vars(defaults) == PlanOptions()


def test_argument_specs_document_every_option_like_plan_options():
    import yaml

    from provisioner import plan as plan_module

    specs = yaml.safe_load((ROLE / "meta" / "argument_specs.yml").read_text())["argument_specs"]["main"]["options"]
    defaults = yaml.safe_load((ROLE / "defaults" / "main.yml").read_text())
    assert set(specs) == set(PlanOptions.known_vars())
    for name, spec in specs.items():
        assert spec.get("description"), name
        assert spec.get("type"), name
        assert "default" in spec and spec["default"] == defaults[name], name
    choices = {
        "plan_thp": plan_module.THP_CHOICES,
        "plan_thp_defrag": plan_module.THP_DEFRAG_CHOICES,
        "plan_hugepages_size": (None, *plan_module.HUGEPAGES_SIZES),
        "plan_tuned_profile": plan_module.TUNED_PROFILES,
        "plan_storage_level": plan_module.STORAGE_LEVELS,
        "plan_storage_backend": plan_module.STORAGE_BACKENDS,
    }
    for name, expected in choices.items():
        assert tuple(specs[name]["choices"]) == tuple(expected), name


def test_role_tasks_pass_every_option_to_the_action_plugin():
    import yaml

    tasks = yaml.safe_load((ROLE / "tasks" / "main.yml").read_text())
    (derive,) = [t for t in tasks if "provisioner_plan" in t]
    assert set(derive["provisioner_plan"]) == set(PlanOptions.known_vars())
    for task in tasks:
        assert "plan" in task["tags"], task["name"]


def test_memory_values_follow_the_installed_ram_not_what_a_boot_reserved(vm):
    """A reboot that reserves 1 GiB pages on the kernel command line changes MemTotal (what the
    kernel keeps at boot), not the RAM: the plan's memory-derived values stay, so a converged host's
    first run after that reboot rewrites nothing. Without memory blocks in the facts: MemTotal."""
    options = PlanOptions(hugepages_size="1G", hugepages_count=1)
    before = copy.deepcopy(vm)
    before["memory"].update(total_bytes=15_700 * 1024**2, installed_bytes=16 * 1024**3, hugepages_1g_supported=True)
    after = copy.deepcopy(before)
    after["memory"]["total_bytes"] -= 1024**2 + 12 * 4096  # the boot kept a little more
    memory_keys = ("feature_matrix_rows", "serving_memory_budget_bytes", "ray_object_store_bytes", "ray_memory_bytes")
    plans = [derive_plan(f, options).to_dict() for f in (before, after)]
    assert plans[0] == plans[1]
    assert all(k in plans[0]["values"] for k in memory_keys), sorted(plans[0]["values"])
    # Sized by MemTotal where the facts have no installed figure: then the two boots differ.
    for f in (before, after):
        f["memory"]["installed_bytes"] = None
    by_memtotal = [derive_plan(f, options).to_dict()["values"] for f in (before, after)]
    assert by_memtotal[0]["feature_matrix_rows"] != by_memtotal[1]["feature_matrix_rows"]

"""The plan's thread pools of the other runtimes, the DataLoader split and the feature matrix,
on the four hardware fixtures, and the refusals that name the value and its limit."""

from __future__ import annotations

import pytest
from facts_fixtures import load

from provisioner.plan import (
    FEATURE_MATRIX_MARGIN_MIN_BYTES,
    GIB,
    PlanError,
    PlanOptions,
    dataloader_split,
    derive_plan,
)

# machine -> (physical cores, sockets, DataLoader workers, training threads)
MACHINES = {
    "epyc_4545p": (16, 1, 4, 12),
    "xeon_2s": (64, 2, 16, 48),
    "vm_2vcpu": (2, 1, 1, 1),
    "laptop_4c": (4, 1, 1, 3),
}
NEW_KEYS = (
    "polars_threads",
    "arrow_cpu_threads",
    "arrow_io_threads",
    "tf_intra_op_threads",
    "tf_inter_op_threads",
    "torch_interop_threads",
    "joblib_workers",
    "dataloader_workers",
    "dataloader_threads",
    "feature_matrix_rows",
    "feature_matrix_features",
    "feature_matrix_bytes",
)


@pytest.mark.parametrize("machine", MACHINES)
def test_runtime_pools_follow_the_physical_cores_and_sockets(machine):
    cores, sockets, _, _ = MACHINES[machine]
    plan = derive_plan(load(machine))
    assert plan.value("threads_per_job") == cores
    for key in ("polars_threads", "arrow_cpu_threads", "tf_intra_op_threads", "joblib_workers"):
        assert plan.value(key) == cores, key
    assert plan.value("tf_inter_op_threads") == sockets
    assert plan.value("torch_interop_threads") == sockets
    assert plan.value("arrow_io_threads") == 8
    for key in NEW_KEYS:
        assert isinstance(plan.value(key), int) and len(plan.reason(key)) > 20, key


def test_every_new_value_names_how_it_reaches_the_process():
    plan = derive_plan(load("epyc_4545p"))
    assert "POLARS_MAX_THREADS" in plan.reason("polars_threads")
    assert "OMP_NUM_THREADS" in plan.reason("arrow_cpu_threads")
    assert "ARROW_IO_THREADS" in plan.reason("arrow_io_threads")
    assert "TF_NUM_INTRAOP_THREADS" in plan.reason("tf_intra_op_threads")
    assert "TF_NUM_INTEROP_THREADS" in plan.reason("tf_inter_op_threads")
    assert "LOKY_MAX_CPU_COUNT" in plan.reason("joblib_workers")
    # torch reads no variable for its inter-op pool: the reason says which call takes the value.
    reason = plan.reason("torch_interop_threads")
    assert "torch.set_num_interop_threads" in reason and "no variable" in reason


@pytest.mark.parametrize("machine", MACHINES)
def test_dataloader_workers_and_threads_fit_the_cores(machine):
    cores, _, workers, threads = MACHINES[machine]
    plan = derive_plan(load(machine))
    assert (plan.value("dataloader_workers"), plan.value("dataloader_threads")) == (workers, threads)
    assert plan.value("dataloader_workers") + plan.value("dataloader_threads") <= cores


@pytest.mark.parametrize("cores", [1, 2, 3, 4, 7, 8, 16, 64, 192])
def test_dataloader_split_never_exceeds_the_cores(cores):
    workers, threads = dataloader_split(cores)
    assert threads >= 1 and workers >= 0
    assert workers + threads == cores
    assert workers == (0 if cores == 1 else max(1, cores // 4))


def test_one_core_loads_in_the_training_process():
    assert dataloader_split(1) == (0, 1)


def test_dataloader_workers_option():
    plan = derive_plan(load("epyc_4545p"), PlanOptions(dataloader_workers=6))
    assert (plan.value("dataloader_workers"), plan.value("dataloader_threads")) == (6, 10)
    assert "plan_dataloader_workers" in plan.reason("dataloader_workers")
    none = derive_plan(load("epyc_4545p"), PlanOptions(dataloader_workers=0))
    assert (none.value("dataloader_workers"), none.value("dataloader_threads")) == (0, 16)


@pytest.mark.parametrize("workers", [16, 17, 64])
def test_dataloader_workers_leaving_no_core_are_refused_naming_value_and_limit(workers):
    with pytest.raises(PlanError) as err:
        derive_plan(load("epyc_4545p"), PlanOptions(dataloader_workers=workers))
    message = str(err.value)
    assert f"plan_dataloader_workers={workers}" in message and "16 physical cores" in message
    assert "at most 15 worker(s)" in message and "plan_allow_oversubscription" in message
    assert "\n" not in message


def test_dataloader_oversubscription_when_allowed_warns():
    plan = derive_plan(load("vm_2vcpu"), PlanOptions(dataloader_workers=4, allow_oversubscription=True))
    assert (plan.value("dataloader_workers"), plan.value("dataloader_threads")) == (4, 1)
    assert any("DataLoader" in w and "oversubscribed" in w for w in plan.warnings)


def test_negative_dataloader_workers_are_refused():
    with pytest.raises(PlanError, match="plan_dataloader_workers must be 0 or more"):
        PlanOptions(dataloader_workers=-1)


def test_trials_above_the_cores_are_refused_naming_value_and_limit():
    with pytest.raises(PlanError, match=r"plan_trials=5 is more than the 4 physical cores"):
        derive_plan(load("laptop_4c"), PlanOptions(trials=5))


# --------------------------------------------------------------------------
# the feature matrix
# --------------------------------------------------------------------------


@pytest.mark.parametrize("machine", MACHINES)
def test_feature_matrix_fits_in_ram_after_the_margin(machine):
    facts = load(machine)
    total = facts["memory"]["total_bytes"]
    plan = derive_plan(facts)
    rows, features, size = (plan.value(k) for k in ("feature_matrix_rows", "feature_matrix_features", "feature_matrix_bytes"))
    assert features == 200
    assert size == rows * features * 4
    budget = total - max(FEATURE_MATRIX_MARGIN_MIN_BYTES, int(total * 0.2))
    assert size <= budget < size + features * 4  # the most whole rows that fit
    assert size < total


def test_feature_matrix_after_hugepages():
    facts = load("vm_2vcpu")
    plain = derive_plan(facts).value("feature_matrix_bytes")
    reserved = derive_plan(facts, PlanOptions(hugepages_size="2M", hugepages_count=2048))  # 4 GiB
    assert reserved.value("feature_matrix_bytes") < plain - 3 * GIB
    assert "hugepages" in reserved.reason("feature_matrix_rows")


def test_feature_matrix_features_option_scales_the_rows():
    facts = load("laptop_4c")
    wide = derive_plan(facts, PlanOptions(feature_matrix_features=1000))
    narrow = derive_plan(facts)
    assert wide.value("feature_matrix_features") == 1000
    assert abs(wide.value("feature_matrix_rows") * 5 - narrow.value("feature_matrix_rows")) <= 5


def test_feature_matrix_rows_that_fit_are_kept():
    plan = derive_plan(load("laptop_4c"), PlanOptions(feature_matrix_rows=1_000_000))
    assert plan.value("feature_matrix_rows") == 1_000_000
    assert plan.value("feature_matrix_bytes") == 1_000_000 * 200 * 4
    assert "plan_feature_matrix_rows" in plan.reason("feature_matrix_rows")


def test_feature_matrix_rows_that_cannot_fit_are_refused_naming_value_and_limit():
    largest = derive_plan(load("laptop_4c")).value("feature_matrix_rows")
    derive_plan(load("laptop_4c"), PlanOptions(feature_matrix_rows=largest))  # the limit itself fits
    with pytest.raises(PlanError) as err:
        derive_plan(load("laptop_4c"), PlanOptions(feature_matrix_rows=largest + 1))
    message = str(err.value)
    assert f"plan_feature_matrix_rows={largest + 1}" in message
    assert f"at most {largest} rows" in message and "GiB" in message and "\n" not in message


def test_feature_matrix_that_hugepages_leave_no_room_for_is_refused():
    facts = load("vm_2vcpu")
    # 90% of the RAM in hugepages and rows of 4 GB: the margin's 2 GiB floor leaves room for none.
    with pytest.raises(PlanError, match="no float32 row"):
        derive_plan(facts, PlanOptions(hugepages_size="2M", hugepages_share=0.9, feature_matrix_features=10**9))


@pytest.mark.parametrize(
    "variables, match",
    [
        ({"plan_feature_matrix_features": 0}, "plan_feature_matrix_features must be 1 or more"),
        ({"plan_feature_matrix_rows": "0"}, "plan_feature_matrix_rows must be 1 or more"),
        ({"plan_feature_matrix_rows": "many"}, "plan_feature_matrix_rows must be a whole number"),
        ({"plan_dataloader_workers": "two"}, "plan_dataloader_workers must be a whole number"),
    ],
)
def test_bad_option_values_are_refused(variables, match):
    with pytest.raises(PlanError, match=match):
        PlanOptions.from_vars(variables)


def test_options_from_strings():
    options = PlanOptions.from_vars(
        {"plan_dataloader_workers": "3", "plan_feature_matrix_features": "50", "plan_feature_matrix_rows": "1000"}
    )
    assert (options.dataloader_workers, options.feature_matrix_features, options.feature_matrix_rows) == (3, 50, 1000)

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


# --------------------------------------------------------------------------
# Polars' pool and joblib's workers set by option, and the evidence of tuned values
# --------------------------------------------------------------------------

COUNT_OPTIONS = {"polars_threads": "POLARS_MAX_THREADS", "joblib_workers": "LOKY_MAX_CPU_COUNT"}


@pytest.mark.parametrize("key", COUNT_OPTIONS)
def test_an_own_count_set_by_its_option_says_so(key):
    before = derive_plan(load("epyc_4545p")).to_dict()["values"]
    plan = derive_plan(load("epyc_4545p"), PlanOptions.from_vars({f"plan_{key}": "1"}))
    assert plan.value(key) == 1
    reason = plan.reason(key)
    assert reason.startswith(f"1: plan_{key}; ") and COUNT_OPTIONS[key] in reason and "\n" not in reason
    # Nothing else moves: the thread count and the other runtimes' pools stay the rule's.
    assert {k: v for k, v in plan.to_dict()["values"].items() if k != key} == {k: v for k, v in before.items() if k != key}
    assert plan.warnings == derive_plan(load("epyc_4545p")).warnings


@pytest.mark.parametrize("key", COUNT_OPTIONS)
def test_an_own_count_of_all_the_cores_is_kept(key):
    plan = derive_plan(load("laptop_4c"), PlanOptions.from_vars({f"plan_{key}": 4}))
    assert plan.value(key) == 4 and plan.reason(key).startswith(f"4: plan_{key}; ")


@pytest.mark.parametrize("key", COUNT_OPTIONS)
@pytest.mark.parametrize("value", [5, 8, 64])
def test_an_own_count_above_the_cores_is_refused_naming_value_and_fix(key, value):
    with pytest.raises(PlanError) as err:
        derive_plan(load("laptop_4c"), PlanOptions.from_vars({f"plan_{key}": value}))
    message = str(err.value)
    assert message.startswith(f"plan_{key}={value} is more than the 4 physical cores")
    assert f"lower plan_{key} or set plan_allow_oversubscription: true" in message
    assert "\n" not in message


@pytest.mark.parametrize("key", COUNT_OPTIONS)
def test_an_own_count_above_the_cores_when_allowed_warns(key):
    plan = derive_plan(load("laptop_4c"), PlanOptions.from_vars({f"plan_{key}": 6, "plan_allow_oversubscription": True}))
    assert plan.value(key) == 6
    assert plan.reason(key).startswith(f"6: plan_{key}, above 4 physical cores (plan_allow_oversubscription: true); ")
    assert [w for w in plan.warnings if "oversubscribed" in w] == [
        f"6 {'Polars threads' if key == 'polars_threads' else 'joblib workers'} on 4 physical cores: "
        "oversubscribed by choice (plan_allow_oversubscription)"
    ]


@pytest.mark.parametrize("value", [1, 4, 64])
def test_arrow_io_threads_set_by_its_option_are_not_bounded_by_the_cores(value):
    """IO threads wait on the drive: any count of one or more is kept, on 4 cores, with no warning."""
    before = derive_plan(load("laptop_4c"))
    plan = derive_plan(load("laptop_4c"), PlanOptions.from_vars({"plan_arrow_io_threads": str(value)}))
    assert plan.value("arrow_io_threads") == value
    reason = plan.reason("arrow_io_threads")
    assert reason.startswith(f"{value}: plan_arrow_io_threads; ARROW_IO_THREADS") and "default (8)" in reason, reason
    moved = {k for k, v in plan.to_dict()["values"].items() if before.to_dict()["values"][k] != v}
    assert moved == ({"arrow_io_threads"} if value != 8 else set())
    assert plan.warnings == before.warnings
    assert before.value("arrow_io_threads") == 8 and "Arrow's own default" in before.reason("arrow_io_threads")


def test_tf_inter_op_threads_set_by_its_option_leave_torchs_and_are_bounded_by_the_cores():
    """The rule is one per socket (xeon_2s: 2); the option sets TensorFlow's pool only."""
    before = derive_plan(load("xeon_2s"))
    cores = before.value("threads_per_job")
    plan = derive_plan(load("xeon_2s"), PlanOptions.from_vars({"plan_tf_inter_op_threads": "4"}))
    assert plan.value("tf_inter_op_threads") == 4 and plan.value("torch_interop_threads") == before.value("torch_interop_threads")
    reason = plan.reason("tf_inter_op_threads")
    assert reason.startswith("4: plan_tf_inter_op_threads; TF_NUM_INTEROP_THREADS") and "the rule's 2 (one per socket)" in reason
    moved = {k for k, v in plan.to_dict()["values"].items() if before.to_dict()["values"][k] != v}
    assert moved == {"tf_inter_op_threads"} and plan.warnings == before.warnings
    with pytest.raises(PlanError, match=rf"^plan_tf_inter_op_threads={cores + 1} is more than the {cores} physical cores"):
        derive_plan(load("xeon_2s"), PlanOptions.from_vars({"plan_tf_inter_op_threads": cores + 1}))
    allowed = derive_plan(
        load("xeon_2s"), PlanOptions.from_vars({"plan_tf_inter_op_threads": cores + 1, "plan_allow_oversubscription": True})
    )
    assert [w for w in allowed.warnings if "oversubscribed" in w] == [
        f"{cores + 1} TensorFlow inter-op threads on {cores} physical cores: oversubscribed by choice (plan_allow_oversubscription)"
    ]


@pytest.mark.parametrize("key", [*COUNT_OPTIONS, "arrow_io_threads", "tf_inter_op_threads"])
@pytest.mark.parametrize(
    ("value", "match"),
    [(0, "must be 1 or more"), ("-2", "must be 1 or more"), ("four", "must be a whole number"), (True, "must be a whole number")],
)
def test_an_own_count_below_one_or_not_a_number_is_refused(key, value, match):
    with pytest.raises(PlanError, match=f"plan_{key} {match}"):
        PlanOptions.from_vars({f"plan_{key}": value})


def test_null_own_counts_are_the_rule():
    options = PlanOptions.from_vars({"plan_polars_threads": None, "plan_joblib_workers": "", "plan_tuned": {}})
    assert options == PlanOptions()
    assert derive_plan(load("xeon_2s"), options).to_dict() == derive_plan(load("xeon_2s")).to_dict()


def test_tuned_values_lead_their_reason_with_the_evidence():
    variables = {
        "plan_polars_threads": 4,
        "plan_tuned": {"polars_threads": "1.21x over 11 pairs (features)", "threads_per_job": "no gain\n  from SMT"},
    }
    plan = derive_plan(load("epyc_4545p"), PlanOptions.from_vars(variables))
    assert plan.reason("polars_threads").startswith("tuned: 1.21x over 11 pairs (features); 4: plan_polars_threads; ")
    # A value not set by its option is marked all the same (tune writes both); one line.
    plain = derive_plan(load("epyc_4545p"))
    assert plan.reason("threads_per_job") == f"tuned: no gain from SMT; {plain.reason('threads_per_job')}"
    assert plan.value("threads_per_job") == plain.value("threads_per_job")
    untouched = [k for k in plain.to_dict()["values"] if k not in ("polars_threads", "threads_per_job")]
    assert all(plan.reason(k) == plain.reason(k) for k in untouched)


def test_tuned_evidence_reaches_the_plan_dict_and_a_json_string_is_read():
    options = PlanOptions.from_vars({"plan_tuned": '{"joblib_workers": "1.1x"}'})
    assert options.tuned_evidence == {"joblib_workers": "1.1x"}
    settings = {s["key"]: s for s in derive_plan(load("vm_2vcpu"), options).to_dict()["settings"]}
    assert settings["joblib_workers"]["reason"].startswith("tuned: 1.1x; 2: LOKY_MAX_CPU_COUNT")


def test_a_tuned_name_that_is_no_plan_value_is_refused_naming_the_values():
    with pytest.raises(PlanError) as err:
        derive_plan(load("laptop_4c"), PlanOptions.from_vars({"plan_tuned": {"polar_threads": "1.2x", "polars_threads": "1.2x"}}))
    message = str(err.value)
    assert message.startswith("plan_tuned names polar_threads, not a value of the plan")
    for key in derive_plan(load("laptop_4c")).to_dict()["values"]:
        assert key in message
    assert "\n" not in message


@pytest.mark.parametrize(
    ("value", "match"),
    [
        (["polars_threads"], "plan_tuned must be a mapping"),
        ("polars_threads=1.2x", "plan_tuned must be a mapping"),
        ({"polars_threads": 1.2}, "evidence strings"),
        ({"polars_threads": "  "}, "neither empty"),
        ({"": "1.2x"}, "neither empty"),
    ],
)
def test_bad_tuned_evidence_is_refused(value, match):
    with pytest.raises(PlanError, match=match):
        PlanOptions.from_vars({"plan_tuned": value})

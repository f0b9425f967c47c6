"""provisioner tune off the hosts: the options refused before any host is touched, the knobs'
candidates, hardware classes, the host driver against a simulated box with a real Optuna study
(budget, resume, a kept and a dropped knob), and the write-back into a hand-written host_vars file."""

from __future__ import annotations

import copy
import json
import random
import re
from dataclasses import replace
from pathlib import Path
from typing import Any

import pytest

from provisioner.constants import SERVING_ALLOCATORS
from provisioner.errors import BadInput
from provisioner.tune import classes, driver, knobs, live, pairs, proposal

FIXTURES = Path(__file__).resolve().parents[1] / "fixtures" / "facts"


# ---------------------------------------------------------------- options


@pytest.mark.parametrize(("text", "seconds"), [("10m", 600), ("90s", 90), ("1h30m", 5400), ("120", 120), ("2m30s", 150)])
def test_budget_read(text: str, seconds: int) -> None:
    assert proposal.parse_budget(text) == seconds


@pytest.mark.parametrize(("text", "said"), [("ten", "not a duration"), ("", "not a duration"), ("30s", "under 60 s")])
def test_budget_refused(text: str, said: str) -> None:
    with pytest.raises(BadInput, match=said):
        proposal.parse_budget(text)


def test_workloads_and_knobs() -> None:
    assert proposal.check_workloads([]) == list(proposal.DEFAULT_TUNED)
    assert {"features", "dataloader", "sklearn", "hpo"} <= set(proposal.DEFAULT_TUNED)
    # Tuned only when named: the Parquet scan (it drops the page cache) and TensorFlow (an opt-in component).
    assert set(proposal.TUNABLE) - set(proposal.DEFAULT_TUNED) == {"parquet", "tensorflow"}
    assert proposal.check_workloads(["parquet"]) == ["parquet"]
    with pytest.raises(
        BadInput, match=r"^--knobs: arrow_io_threads is a knob of parquet, tuned only when named: add --workloads parquet$"
    ):
        proposal.check_knobs(["arrow_io_threads"], proposal.check_workloads([]))
    with pytest.raises(BadInput, match=r"--workloads: gemmm cannot be tuned; the workloads tune measures: "):
        proposal.check_workloads(["gemmm"])
    assert proposal.check_knobs(["polars_threads"], ["features"]) == ["polars_threads"]
    with pytest.raises(
        BadInput, match=r"--knobs: polars_threads is not a knob of dataloader; tune can search: dataloader_workers"
    ):
        proposal.check_knobs(["polars_threads"], ["dataloader"])


def test_every_value_a_workload_declares_is_a_knob_or_docs_say_why_not() -> None:
    from provisioner.smoke.workloads import WORKLOADS

    declared = {k for w in WORKLOADS for k in w.KNOBS}
    table = (Path(__file__).resolve().parents[2] / "docs" / "tune.md").read_text().split("tune does not search, and why:", 1)[1]
    said = {name for row in table.split("\n\n", 2)[1].splitlines() for name in re.findall(r"`(\w+)`", row.split("|")[1])}
    assert declared - set(knobs.KNOBS) == said, "docs/tune.md's table of values tune does not search is out of date"


def test_every_tunable_workload_has_a_knob_tune_applies() -> None:
    from provisioner.smoke.workloads import BY_NAME

    for name in proposal.TUNABLE:
        assert knobs.searchable(BY_NAME[name].KNOBS), name


# ---------------------------------------------------------------- candidates


def test_candidates_within_the_cores() -> None:
    got = knobs.candidates("polars_threads", rule=4, cores=4, logical=8)
    assert [c.value for c in got] == [1, 2, 3]
    assert got[0].env == {"POLARS_MAX_THREADS": "1"}
    # The library's default (the logical CPUs) only where oversubscription is allowed: a count the plan can carry.
    over = knobs.candidates("polars_threads", rule=4, cores=4, logical=8, allow_oversubscription=True)
    assert over[-1].value == 8 and over[-1].env == {"POLARS_MAX_THREADS": "8"} and over[-1].label == "8 (library default)"
    # DataLoader: 0 workers is the library's default; the training threads take what the workers leave.
    # (cores - 1 workers at most next to one training thread, as the plan allows; more only with oversubscription.)
    dl = knobs.candidates("dataloader_workers", rule=1, cores=2)
    assert [(c.value, c.env["PROVISIONER_DATALOADER_THREADS"]) for c in dl] == [(0, "2")]
    dl = knobs.candidates("dataloader_workers", rule=1, cores=2, allow_oversubscription=True)
    assert [(c.value, c.env["PROVISIONER_DATALOADER_THREADS"]) for c in dl] == [(0, "2"), (2, "1")]
    assert dl[0].label == "0 (library default)"
    # Parallel trials: N of ml-env --trials N, 1 (Optuna's one trial at a time) the library's default.
    trials = knobs.candidates("trials", rule=4, cores=4, logical=8, allow_oversubscription=True)
    assert [c.label for c in trials] == ["1 (library default)", "2", "3"]
    assert trials[1].env == {"PROVISIONER_TUNE_TRIALS": "2"}
    # Every value tune can keep is one the plan accepts back as its override.
    from provisioner.plan import PlanError, PlanOptions, derive_plan

    facts = _facts("vm_2vcpu")
    for name, knob in knobs.KNOBS.items():
        for c in knobs.candidates(name, rule=None, cores=facts["cpu"]["cores"], logical=facts["cpu"]["threads"]):
            try:
                plan = derive_plan(facts, PlanOptions.from_vars({knob.option: c.value}))
            except PlanError as exc:
                pytest.fail(f"{name}={c.value}: {exc}")
            assert {s.key: s.value for s in plan.settings}[name] == c.value, (name, c.value)


def test_arrows_io_pool_counts_in_powers_of_two_to_twice_its_own_eight_whatever_the_cores() -> None:
    # Its threads wait on the drive: above the cores without oversubscription, a few counts spread out.
    got = knobs.candidates("arrow_io_threads", rule=2, cores=2, logical=4)
    assert [c.label for c in got] == ["1", "4", "8 (library default)", "16"]
    assert got[2].env == {"ARROW_IO_THREADS": "8"}
    # The rule is Arrow's own 8 (the plan's default).
    assert [c.value for c in knobs.candidates("arrow_io_threads", rule=8, cores=2)] == [1, 2, 4, 16]
    # The cores themselves are a candidate, and the counts go up to them where they are more.
    assert [c.value for c in knobs.candidates("arrow_io_threads", rule=8, cores=24)] == [1, 2, 4, 16, 24]
    assert [c.value for c in knobs.candidates("arrow_io_threads", rule=8, cores=64)] == [1, 2, 4, 16, 32, 64]


def test_tensorflows_inter_op_pool_counts_to_the_cores_and_the_logical_cpus_only_when_allowed() -> None:
    got = knobs.candidates("tf_inter_op_threads", rule=1, cores=4, logical=8)
    assert [c.value for c in got] == [2, 3, 4] and got[0].env == {"TF_NUM_INTEROP_THREADS": "2"}
    over = knobs.candidates("tf_inter_op_threads", rule=1, cores=4, logical=8, allow_oversubscription=True)
    assert over[-1].label == "8 (library default)"


def test_the_parquet_scan_is_measured_cold_with_the_candidates_io_pool(tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> None:
    from provisioner.smoke.workloads import parquet

    dropped: list[int] = []
    monkeypatch.setattr(parquet, "drop_caches", lambda: dropped.append(1))  # None: the cache dropped

    class ParquetBox(Box):
        tune_state: dict[str, Any]  # the runner's: what a workload's tune_prepare made

        def worker(self, task: str, env: dict[str, str | None] | None = None, **extra: Any) -> dict[str, Any]:
            self.now += 2
            if task == "parquet_write":
                assert env is None and not extra  # written once, as the smoke test writes it
                return {"path": "/data/smoke.parquet", "file_bytes": 2 * 10**9}
            assert task == "parquet_scan" and extra == {"path": "/data/smoke.parquet", "tune": True}, (task, extra)
            count = int((env or {}).get("ARROW_IO_THREADS") or 8)
            self.runs.append(dict(env or {}))
            seconds = self.rng.gauss(1, 0.02) / (1.3 if count == 2 else 1.0)
            return {"seconds": seconds, "decoded_bytes": 3 * 10**9, "io_threads": count}

    box = ParquetBox({}, gain=1.0)
    box.plan, box.tune_state = {"arrow_io_threads": 8}, {}
    spec = {"workloads": ["parquet"], "knobs": [], "budget_s": 100_000}
    out = driver.run(box, spec, ledger=driver.Ledger(str(tmp_path)), clock=box.clock)
    got = out["workloads"]["parquet"]
    assert got["unit"] == "GB/s scanned"
    io = got["knobs"]["arrow_io_threads"]
    assert io["rule"] == 8 and [c["value"] for c in io["candidates"]] == [1, 2, 4, 16] and io["tuned"]["value"] == 2
    # Every scan ran cold (the cache dropped first, and once before the file was written), each side with its own count.
    assert len(dropped) == len(box.runs) + 1 and {r.get("ARROW_IO_THREADS") for r in box.runs} == {"8", "1", "2", "4", "16"}


def test_where_the_page_cache_stays_the_io_pool_is_not_searched(tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> None:
    from provisioner.smoke.workloads import parquet

    warm = "cannot drop the page cache (Read-only file system: /proc/sys/vm is read-only here): warm-cache figures"
    monkeypatch.setattr(parquet, "drop_caches", lambda: warm)
    box = Box({}, gain=1.0)
    box.plan = {"arrow_io_threads": 8}
    out = driver.run(
        box, {"workloads": ["parquet"], "knobs": [], "budget_s": 100_000}, ledger=driver.Ledger(str(tmp_path)), clock=box.clock
    )
    assert out["workloads"]["parquet"]["knobs"] == {
        "arrow_io_threads": {
            "skipped": "cannot drop the page cache (Read-only file system: /proc/sys/vm is read-only here): "
            "every scan would read memory, not the drive"
        }
    }
    assert box.runs == []  # no file written, nothing measured


def test_a_scan_whose_io_pool_is_not_the_candidates_is_an_error_not_a_figure(monkeypatch: pytest.MonkeyPatch) -> None:
    from provisioner.smoke.workloads import parquet

    caches: list[str | None] = [None]
    monkeypatch.setattr(parquet, "drop_caches", lambda: caches[0])

    class Runner:
        def __init__(self, state: dict[str, Any]) -> None:
            self.tune_state = state

        def worker(self, task: str, env: Any = None, **extra: Any) -> dict[str, Any]:
            return {"seconds": 0.5, "decoded_bytes": 10**9, "io_threads": 8}

    runner = Runner({"parquet": {"path": "/data/smoke.parquet", "file_bytes": 10**9}})
    assert parquet.tune_drive(runner, {}, {"ARROW_IO_THREADS": None}) == {"scan_gbps": 2.0, "io_threads": 8}
    assert parquet.tune_drive(runner, {}, {"ARROW_IO_THREADS": "2"}) == {
        "error": "parquet: the scan ran with 8 IO threads, not ARROW_IO_THREADS=2"
    }
    assert "nothing prepared" in parquet.tune_drive(Runner({}), {}, {})["error"]
    caches[0] = "cannot drop the page cache (Permission denied): warm-cache figures"  # since the run began
    assert parquet.tune_drive(runner, {}, {}) == {"error": f"parquet: {caches[0]}"}


def test_tensorflows_inter_op_pool_is_measured_on_the_training_step(tmp_path: Path) -> None:
    box = Box({"TF_NUM_INTEROP_THREADS": "2"}, gain=1.25)
    box.plan = {"tf_inter_op_threads": 1}
    out = driver.run(
        box, {"workloads": ["tensorflow"], "knobs": [], "budget_s": 100_000}, ledger=driver.Ledger(str(tmp_path)), clock=box.clock
    )
    got = out["workloads"]["tensorflow"]
    # tf_intra_op_threads is declared but not a knob (docs/tune.md says why): only the inter-op pool is searched.
    assert got["unit"] == "samples/s" and list(got["knobs"]) == ["tf_inter_op_threads"]
    assert got["knobs"]["tf_inter_op_threads"]["tuned"]["value"] == 2
    # Without TensorFlow in the environment: one reason for the knob, nothing measured.
    box = Box({}, gain=1.0)
    box.plan, box.missing = {"tf_inter_op_threads": 1}, "tensorflow is not installed in this environment (component tensorflow)"
    out = driver.run(
        box, {"workloads": ["tensorflow"], "knobs": [], "budget_s": 100_000}, ledger=driver.Ledger(str(tmp_path)), clock=box.clock
    )
    assert out["workloads"]["tensorflow"]["knobs"] == {"tf_inter_op_threads": {"skipped": box.missing}} and box.runs == []


def test_the_servers_threads_and_workers_share_the_cores() -> None:
    plan = {"serving_threads_per_worker": 2, "serving_workers": 4}  # 8 cores: the rule's 8 // 2 workers
    threads = knobs.candidates("serving_threads_per_worker", rule=2, cores=8, kept={}, plan=plan)
    # The workers follow the threads as the plan's do (cores // threads), so every count fits.
    assert [c.value for c in threads] == [1, 3, 4, 5, 6, 7, 8]
    four = threads[2].env
    assert four == {knobs.SERVING_THREADS: "4"} and knobs.serving_shape(four, plan, 8) == (2, 4)
    # With 4 threads kept the plan's workers are 2 (the rule the workers are measured against), and only fewer fit.
    workers = knobs.KNOBS["serving_workers"]
    assert workers.rule_given is not None and workers.rule_given(4, four, plan, 8) == 2
    got = knobs.candidates("serving_workers", rule=2, cores=8, kept=four, plan=plan)
    assert [c.label for c in got] == ["1 (library default)"] and got[0].env == {knobs.SERVING_WORKERS: "1"}
    # plan_serving_workers set (the spec's "fixed", from the inventory), even to the rule's own 4:
    # the workers stay, and only the threads that fit beside them are candidates.
    for set_to, fit in ((3, [1]), (4, [1])):
        fixed = {"serving_threads_per_worker": 2, "serving_workers": set_to, "fixed": ["serving_workers"]}
        assert knobs.serving_shape({knobs.SERVING_THREADS: "1"}, fixed, 8) == (set_to, 1)
        assert [c.value for c in knobs.candidates("serving_threads_per_worker", rule=2, cores=8, kept={}, plan=fixed)] == fit
    # Oversubscription allowed: every count.
    over = knobs.candidates("serving_workers", rule=2, cores=8, kept=four, plan=plan, allow_oversubscription=True)
    assert [c.value for c in over] == [1, 3, 4, 5, 6, 7, 8]
    # The serving workload searches the threads first: the workers' rule then follows the kept threads.
    from provisioner.smoke.workloads import serving

    assert knobs.searchable(serving.KNOBS) == ["serving_threads_per_worker", "serving_workers", "serving_allocator"]


def test_the_servers_allocator_is_the_other_one_measured_under_the_shape_kept() -> None:
    plan = {"serving_threads_per_worker": 1, "serving_workers": 2, "serving_allocator": "glibc"}
    (jemalloc,) = knobs.candidates("serving_allocator", rule="glibc", cores=2, kept={}, plan=plan)
    assert (jemalloc.label, jemalloc.env, jemalloc.live) == ("jemalloc", {knobs.SERVING_ALLOCATOR: "jemalloc"}, ())
    (glibc,) = knobs.candidates("serving_allocator", rule="jemalloc", cores=2, kept={}, plan=plan)
    assert glibc.label == "glibc (library default)"
    # A measurement runs the candidate's allocator with the shape kept before it, else the plan's.
    kept = {knobs.SERVING_THREADS: "2"}
    assert knobs.planned({**kept, **jemalloc.env}, plan, 2) == {
        **plan,
        "serving_threads_per_worker": 2,
        "serving_workers": 1,
        "serving_allocator": "jemalloc",
    }
    assert knobs.planned({}, {k: v for k, v in plan.items() if k != "serving_allocator"}, 2)["serving_allocator"] == "glibc"
    # The shape's studies are keyed by the plan's allocator too: measured under jemalloc, not resumed under glibc.
    assert "serving_allocator" in knobs.KNOBS["serving_workers"].follows
    assert knobs.KNOBS["serving_allocator"].option == "plan_serving_allocator"
    # The plan's choices (the zipapp's copy: it imports no constants), the stock one glibc's.
    assert knobs.KNOBS["serving_allocator"].choices == SERVING_ALLOCATORS and knobs.KNOBS["serving_allocator"].stock == "glibc"


def test_thps_mode_is_a_kernel_knob_every_mode_a_candidate() -> None:
    thp = knobs.KNOBS["thp_enabled"]
    assert thp.option == "plan_thp"  # the plan's own option, which role cpu_tuning applies
    from provisioner.constants import THP_CHOICES

    assert sorted(thp.choices) == sorted(THP_CHOICES)  # the modes the plan accepts (knobs.py imports nothing of provisioner's)
    got = knobs.candidates("thp_enabled", rule="madvise", cores=2)
    assert [c.value for c in got] == ["always", "never"]
    # Nothing reaches the workload's environment: the kernel's file is set for each measurement.
    assert [(c.env, c.live) for c in got] == [({}, ((knobs.THP_ENABLED, "always"),)), ({}, ((knobs.THP_ENABLED, "never"),))]


def test_thps_defrag_policy_is_a_kernel_knob_every_policy_a_candidate() -> None:
    defrag = knobs.KNOBS["thp_defrag"]
    assert defrag.option == "plan_thp_defrag"  # the plan's option, which role cpu_tuning applies
    from provisioner.constants import THP_DEFRAG_CHOICES

    assert sorted(defrag.choices) == sorted(THP_DEFRAG_CHOICES)
    got = knobs.candidates("thp_defrag", rule="madvise", cores=2)
    assert [c.value for c in got] == ["always", "defer", "defer+madvise", "never"]
    assert [c.live for c in got] == [((knobs.THP_DEFRAG, v),) for v in ("always", "defer", "defer+madvise", "never")]
    assert all(c.env == {} for c in got)
    # The triad, which THP moves, declares it after THP's mode: a kept mode is what its search runs under.
    from provisioner.smoke.workloads import triad

    assert triad.KNOBS.index("thp_enabled") < triad.KNOBS.index("thp_defrag")
    assert knobs.searchable(triad.KNOBS)[-2:] == ["thp_enabled", "thp_defrag"]


# ---------------------------------------------------------------- classes


def _facts(name: str) -> dict[str, Any]:
    data: dict[str, Any] = json.loads((FIXTURES / f"{name}.json").read_text())
    return data


def test_identical_hosts_form_one_class() -> None:
    a, b = _facts("xeon_2s"), _facts("xeon_2s")
    b["block_devices"] = list(reversed(b["block_devices"]))  # the kernel named the drives in another order
    b["memory"] = {**b["memory"], "available_bytes": 1}  # what is free now is not the hardware
    other = _facts("vm_2vcpu")
    got = classes.of({"b": b, "a": a, "c": other})
    assert sorted(got.values()) == [["a", "b"], ["c"]]
    c = copy.deepcopy(a)
    c["memory"]["total_bytes"] *= 2
    assert classes.fingerprint(c) != classes.fingerprint(a)


# ---------------------------------------------------------------- the host driver


class Box:
    """A simulated host: a workload figure of 100 with noise, times GAIN for the knob value that helps
    (with THP: for the mode its file MODES says, a fake sysfs file, as a workload started now sees it)."""

    def __init__(self, best: dict[str, str], gain: float, seed: int = 0, seconds: float = 10.0, thp: Path | None = None):
        self.best, self.gain = best, gain
        self.rng = random.Random(seed)
        self.now = 0.0
        self.seconds = seconds
        self.runs: list[dict[str, Any]] = []
        self.thp = thp
        self.plan = {"polars_threads": 2, "dataloader_workers": 1, "thp_enabled": "madvise"}
        self.cpu = {"physical_cores": 2, "logical_cpus": 2}
        self.missing = ""  # why a workload's component is missing ("": it is there)

        class Args:
            profile = "quick"

        self.args = Args()

    def worker(self, task: str, env: dict[str, str | None] | None = None, **extra: Any) -> dict[str, Any]:
        if task == "tensorflow_present":  # its tune_prepare: the environment has TensorFlow, unless told otherwise
            return {"skipped": self.missing} if self.missing else {}
        assert extra == {"tune": True}
        self.now += self.seconds
        seen = dict(env or {})
        if self.thp is not None:
            seen["THP"] = live.current(self.thp.read_text())
        self.runs.append(seen)
        figure = 100.0 * self.rng.gauss(1, 0.02)
        if all(seen.get(k) == v for k, v in self.best.items()):
            figure *= self.gain
        if task == "features":
            return {"polars": {"rows_per_s": figure}}
        if task == "triad":
            return {"gbps": figure}
        if task == "tensorflow":
            return {"samples_per_s": figure}
        return {"planned": {"samples_per_s": figure}}

    def clock(self) -> float:
        return self.now


def test_a_real_gain_is_kept_and_no_effect_is_not(tmp_path: Path) -> None:
    box = Box({"POLARS_MAX_THREADS": "1"}, gain=1.25)
    spec = {"workloads": ["features", "dataloader"], "knobs": [], "budget_s": 10_000}
    out = driver.run(box, spec, ledger=driver.Ledger(str(tmp_path)), clock=box.clock)
    polars = out["workloads"]["features"]["knobs"]["polars_threads"]
    assert polars["rule"] == 2 and polars["tuned"]["value"] == 1 and polars["tuned"]["pairs"] == pairs.MAX_PAIRS
    assert 1.15 < polars["tuned"]["gain"] < 1.35
    loader = out["workloads"]["dataloader"]["knobs"]["dataloader_workers"]
    assert loader["tuned"] is None
    assert all(not c["kept"] and c["decided"] for c in loader["candidates"])
    # Both sides of every pair run the workload as the user's shell would, the candidate's variables on top.
    assert {r.get("POLARS_MAX_THREADS") for r in box.runs[: 2 * pairs.MAX_PAIRS]} == {"1", "2"}


@pytest.mark.parametrize("gib", [16, 192])
def test_every_server_shape_tune_measures_is_one_the_plan_takes_memory_included(gib: int) -> None:
    from provisioner.plan import PlanError, PlanOptions, derive_plan
    from provisioner.plan.serving import SERVING_MIN_CACHE_BYTES
    from provisioner.smoke.target.parent import tune_context

    assert knobs.SERVING_MIN_CACHE_BYTES == SERVING_MIN_CACHE_BYTES
    facts = _facts("epyc_4545p")  # 16 cores: the rule's 4 workers x 4 threads
    facts["memory"]["total_bytes"] = gib * 2**30
    plan = derive_plan(facts)
    assert plan.serving is not None
    values = {**plan.to_dict()["values"], **tune_context(plan.serving, None)}
    cores = facts["cpu"]["cores"]
    for allow in (False, True):
        options = {"plan_allow_oversubscription": allow}
        got = knobs.candidates("serving_threads_per_worker", 4, cores, 32, allow, {}, values)
        for threads in [*range(1, cores + 1), 32]:  # the counts up to the cores, and OpenMP's default: the logical CPUs
            try:
                derive_plan(facts, PlanOptions.from_vars({**options, "plan_serving_threads_per_worker": threads}))
                takes = threads != 4
            except PlanError:
                takes = False
            assert (threads in [c.value for c in got]) == takes, (gib, allow, threads)
        kept: knobs.Env = {knobs.SERVING_THREADS: "2"}  # 8 workers x 2 threads, the workers then measured against the plan's 8
        got = knobs.candidates("serving_workers", 8, cores, 32, allow, kept, values)
        for workers in range(1, 17):
            vars_ = {**options, "plan_serving_threads_per_worker": 2, "plan_serving_workers": workers}
            try:
                derive_plan(facts, PlanOptions.from_vars(vars_))
                takes = workers != 8
            except PlanError:
                takes = False
            assert (workers in [c.value for c in got]) == takes, (gib, allow, workers)
    # On 16 GiB, 16 one-thread workers would leave each no model cache: never measured.
    if gib == 16:
        assert 1 not in [c.value for c in knobs.candidates("serving_threads_per_worker", 4, cores, 32, False, {}, values)]


def test_the_servers_threads_are_kept_then_its_workers_measured_against_the_plans_rule_for_them(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    from provisioner.smoke.workloads import serving

    box = Box({}, gain=1.0)
    box.plan = {"serving_threads_per_worker": 1, "serving_workers": 4}
    box.cpu = {"physical_cores": 4, "logical_cpus": 4}
    shapes: list[tuple[int, int]] = []
    rng = random.Random(3)

    def measured(runner: Any, values: dict[str, Any], _env: Any = None) -> dict[str, Any]:
        # The model server's own step measures (not a worker in the user's shell), reading the plan's
        # values as the candidate makes them: 2 workers x 2 threads win.
        box.now += 10
        shape = (values["serving_workers"], values["serving_threads_per_worker"])
        shapes.append(shape)
        return {"requests_per_s": 100 * rng.gauss(1, 0.02) * (1.3 if shape == (2, 2) else 1.0)}

    prepared: list[Any] = []

    def prepare(runner: Any) -> dict[str, Any]:
        prepared.append(runner)
        return {}

    monkeypatch.setattr(serving, "tune_prepare", prepare)
    monkeypatch.setattr(serving, "tune_drive", measured)
    out = driver.run(
        box, {"workloads": ["serving"], "knobs": [], "budget_s": 100_000}, ledger=driver.Ledger(str(tmp_path)), clock=box.clock
    )
    got = out["workloads"]["serving"]["knobs"]
    threads = got["serving_threads_per_worker"]
    assert [c["value"] for c in threads["candidates"]] == [2, 3, 4] and threads["tuned"]["value"] == 2
    # The workers' rule is what the plan gives 2 threads (4 // 2), and only one worker fewer fits beside them.
    workers = got["serving_workers"]
    assert workers["rule"] == 2 and [c["value"] for c in workers["candidates"]] == [1] and workers["tuned"] is None
    assert set(shapes) == {(4, 1), (2, 2), (1, 3), (1, 4), (1, 2)} and box.runs == []
    assert prepared == [box]  # the model made once, before any pair was timed


def test_the_servers_allocator_is_kept_where_it_wins_and_left_alone_where_a_role_variable_outranks_the_plan(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    from provisioner.smoke.workloads import serving

    rng = random.Random(5)
    seen: list[tuple[str, int]] = []

    def measured(runner: Any, values: dict[str, Any], _env: Any = None) -> dict[str, Any]:
        runner.now += 10
        seen.append((values["serving_allocator"], values["serving_workers"]))
        return {"requests_per_s": 100 * rng.gauss(1, 0.02) * (1.2 if values["serving_allocator"] == "jemalloc" else 1.0)}

    monkeypatch.setattr(serving, "tune_prepare", lambda runner: {})
    monkeypatch.setattr(serving, "tune_drive", measured)
    box = Box({}, gain=1.0)
    box.plan = {"serving_threads_per_worker": 1, "serving_workers": 2, "serving_allocator": "glibc"}
    spec = {"workloads": ["serving"], "knobs": ["serving_allocator"], "budget_s": 100_000}
    got = driver.run(box, spec, ledger=driver.Ledger(str(tmp_path / "a")), clock=box.clock)["workloads"]["serving"]["knobs"]
    assert got["serving_allocator"]["rule"] == "glibc" and got["serving_allocator"]["tuned"]["value"] == "jemalloc"
    assert {a for a, _ in seen} == {"glibc", "jemalloc"}
    # serving_jemalloc set for the host (spec "role_vars", knobs.outranked): what runs is jemalloc whatever the plan says, so
    # the allocator is not searched (a kept value would not be applied) and the shape is measured under it.
    seen.clear()
    box = Box({}, gain=1.0)
    box.plan = {
        "serving_threads_per_worker": 1,
        "serving_workers": 2,
        "serving_allocator": "jemalloc",
        "overridden": {"serving_allocator": ["serving_jemalloc", "jemalloc"]},
    }
    spec = {"workloads": ["serving"], "knobs": ["serving_workers", "serving_allocator"], "budget_s": 100_000}
    got = driver.run(box, spec, ledger=driver.Ledger(str(tmp_path / "b")), clock=box.clock)["workloads"]["serving"]["knobs"]
    assert got["serving_allocator"] == {
        "skipped": "serving_jemalloc is set for this host (its inventory, or an -e that up recorded) and ranks above "
        "plan_serving_allocator: a kept value would not be applied; remove it (from the inventory, or `up -e` it no "
        "more) to let tune measure it"
    }
    assert got["serving_workers"]["candidates"] and {a for a, _ in seen} == {"jemalloc"}
    # Nothing is prepared (the model trained) for the allocator alone where it is not searched.
    monkeypatch.setattr(serving, "tune_prepare", lambda runner: pytest.fail("prepared"))
    spec = {"workloads": ["serving"], "knobs": ["serving_allocator"], "budget_s": 100_000}
    got = driver.run(box, spec, ledger=driver.Ledger(str(tmp_path / "c")), clock=box.clock)["workloads"]["serving"]["knobs"]
    assert list(got) == ["serving_allocator"] and "skipped" in got["serving_allocator"]


def test_a_servers_study_resumes_only_under_the_same_plan_shape_and_server_code(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    from provisioner.smoke.workloads import serving

    box = Box({}, gain=1.0)
    box.cpu = {"physical_cores": 4, "logical_cpus": 4}
    monkeypatch.setattr(serving, "tune_prepare", lambda runner: {})

    def measured(_runner: Any, values: dict[str, Any], _env: Any = None) -> dict[str, Any]:
        box.now += 10
        return {"requests_per_s": 100 * box.rng.gauss(1, 0.02)}

    monkeypatch.setattr(serving, "tune_drive", measured)
    spec = {"workloads": ["serving"], "knobs": ["serving_threads_per_worker"], "budget_s": 100_000}

    def resumed(**plan: Any) -> list[bool]:
        box.plan = {"serving_threads_per_worker": 1, "serving_workers": 4, "serving_code": "a", **plan}
        out = driver.run(box, spec, ledger=driver.Ledger(str(tmp_path)), clock=box.clock)
        return [bool(c.get("resumed")) for c in out["workloads"]["serving"]["knobs"]["serving_threads_per_worker"]["candidates"]]

    assert resumed() == [False] * 3
    assert resumed() == [True] * 3
    # The same labels (2, 3, 4 threads) but other servers: workers the inventory fixes, or new server code.
    assert resumed(fixed=["serving_workers"], serving_workers=1) == [False] * 3
    assert resumed(serving_code="b") == [False] * 3


def test_nothing_is_prepared_for_a_run_with_no_time_left(tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> None:
    from provisioner.smoke.workloads import serving

    box = Box({}, gain=1.0, seconds=30.0)
    box.plan = {"serving_threads_per_worker": 1, "serving_workers": 2, "polars_threads": 2}
    monkeypatch.setattr(serving, "tune_prepare", lambda runner: pytest.fail("prepared with the budget spent"))
    spec = {"workloads": ["features", "serving"], "knobs": [], "budget_s": 70}
    out = driver.run(box, spec, ledger=driver.Ledger(str(tmp_path)), clock=box.clock)
    threads = out["workloads"]["serving"]["knobs"]["serving_threads_per_worker"]
    assert threads["candidates"][0]["reason"] == "the budget ended before its first pair", threads


def test_the_defrag_policys_study_is_not_resumed_under_another_kernel_mode(tmp_path: Path) -> None:
    root, thp = sysfs(tmp_path)
    defrag = root / knobs.THP_DEFRAG.lstrip("/")
    defrag.write_text("always defer defer+madvise [madvise] never\n")
    box = Box({}, gain=1.0, thp=thp)
    box.plan.update(thp_defrag="madvise")
    state = tmp_path / "state"
    spec = {"workloads": ["triad"], "knobs": ["thp_defrag"], "budget_s": 10_000}

    def resumed() -> list[bool]:
        out = driver.run(box, spec, ledger=driver.Ledger(str(state)), clock=box.clock, live=driver.Live(str(state), str(root)))
        return [bool(c.get("resumed")) for c in out["workloads"]["triad"]["knobs"]["thp_defrag"]["candidates"]]

    assert resumed() == [False] * 4 and resumed() == [True] * 4
    thp.write_text("[always] madvise never\n")  # `up` applied another mode since
    assert resumed() == [False] * 4


def test_a_workload_that_cannot_prepare_says_why_for_each_knob_and_measures_nothing(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    from provisioner.smoke.workloads import serving

    box = Box({}, gain=1.0)
    box.plan = {"serving_threads_per_worker": 1, "serving_workers": 2, "polars_threads": 2}
    why = "uvicorn is not installed (the mlstack component serving)"
    monkeypatch.setattr(serving, "tune_prepare", lambda runner: {"skipped": why})
    monkeypatch.setattr(serving, "tune_drive", lambda runner, values, env: pytest.fail("measured"))
    spec = {"workloads": ["serving", "features"], "knobs": [], "budget_s": 10_000}
    out = driver.run(box, spec, ledger=driver.Ledger(str(tmp_path)), clock=box.clock)
    assert out["workloads"]["serving"]["knobs"] == {
        k: {"skipped": why} for k in ("serving_threads_per_worker", "serving_workers", "serving_allocator")
    }
    assert out["workloads"]["features"]["knobs"]["polars_threads"]["candidates"]  # the run went on


def test_the_budget_is_kept_and_a_second_run_resumes(tmp_path: Path) -> None:
    box = Box({"POLARS_MAX_THREADS": "1"}, gain=1.25, seconds=10.0)
    spec = {"workloads": ["features"], "knobs": ["polars_threads"], "budget_s": 100}
    first = driver.run(box, spec, ledger=driver.Ledger(str(tmp_path)), clock=box.clock)
    cand = first["workloads"]["features"]["knobs"]["polars_threads"]["candidates"][0]
    assert not cand["decided"] and not cand["kept"] and first["seconds"] <= 100 * 1.1
    measured = len(cand["ratios"])
    assert measured >= 1
    # The next run starts from the pairs the first one measured (kept in the study on the host).
    box.now = 0.0
    second = driver.run(box, {**spec, "budget_s": 10_000}, ledger=driver.Ledger(str(tmp_path)), clock=box.clock)
    cand2 = second["workloads"]["features"]["knobs"]["polars_threads"]["candidates"][0]
    assert cand2["ratios"][:measured] == cand["ratios"] and cand2["kept"]
    # A third run has nothing left to measure: the verdict comes from the study.
    before = len(box.runs)
    third = driver.run(box, spec, ledger=driver.Ledger(str(tmp_path)), clock=box.clock)
    assert len(box.runs) == before
    assert third["workloads"]["features"]["knobs"]["polars_threads"]["candidates"][0]["resumed"]


def test_a_busy_host_is_refused_unless_forced(tmp_path: Path) -> None:
    box = Box({}, gain=1.0)
    spec = {"workloads": ["features"], "knobs": [], "budget_s": 100}
    out = driver.run(box, spec, ledger=driver.Ledger(str(tmp_path)), clock=box.clock, busy=lambda: 0.6)
    assert "60% of the CPUs were busy" in out["refused"] and "--force" in out["refused"] and not box.runs
    forced = driver.run(box, {**spec, "force": True}, ledger=driver.Ledger(str(tmp_path)), clock=box.clock, busy=lambda: 0.6)
    assert "refused" not in forced and box.runs


# ---------------------------------------------------------------- write-back


HAND_WRITTEN = """\
---
# The GPU-less box in rack 4: keep its own data mount.
plan_data_mountpoint: /srv/data  # NVMe pair
plan_trials: 2
"""


def _kept(host: str = "box1") -> list[proposal.Row]:
    result = {
        "workloads": {
            "features": {
                "knobs": {
                    "polars_threads": {
                        "rule": 2,
                        "candidates": [{"value": 1, "label": "1", "kept": True, "ratios": [1.3] * 11}],
                        "tuned": {"value": 1, "label": "1", "gain": 1.31, "spread": 0.04, "pairs": 11},
                    }
                }
            },
            "dataloader": {
                "knobs": {
                    "dataloader_workers": {
                        "rule": 1,
                        "candidates": [{"value": 0, "label": "0", "kept": False, "reason": "within the noise"}],
                        "tuned": None,
                    }
                }
            },
        }
    }
    return proposal.rows(host, result, measured_on="box1")


def test_write_back_keeps_the_file(tmp_path: Path) -> None:
    inventory = tmp_path / "hosts.yml"
    inventory.write_text("all:\n  hosts:\n    box1:\n")
    path = tmp_path / "host_vars" / "box1.yml"
    path.parent.mkdir()
    path.write_text(HAND_WRITTEN)
    rows = _kept()
    assert [r.kept for r in rows] == [True, False]
    assert proposal.write(inventory, "box1", [r for r in rows if r.kept], day="2026-12-04") == path
    text = path.read_text()
    assert text.startswith(HAND_WRITTEN)  # comments, order and values as they were
    import yaml

    data = yaml.safe_load(text)
    assert data["plan_polars_threads"] == 1 and data["plan_trials"] == 2
    assert data["plan_tuned"] == {"polars_threads": "1.31x over the rule's 2 on features (11 pairs, spread 4%, 2026-12-04)"}
    assert "# provisioner tune 2026-12-04: the rule was 2" in text
    # Written again (a later tune), the same keys are replaced, not repeated.
    proposal.write(inventory, "box1", [r for r in rows if r.kept], day="2026-12-05")
    again = path.read_text()
    assert again.count("plan_polars_threads") == 1 and "2026-12-05" in again and again.startswith(HAND_WRITTEN)
    # The evidence names the host it was measured on for the other members of a class.
    other = proposal.rows("box2", {"workloads": {}}, measured_on="box1")
    assert other == []
    twin = _kept("box2")[0]
    assert twin.evidence("2026-12-04").endswith("2026-12-04, measured on box1)")


def test_write_back_keeps_the_users_comment_mode_and_link(tmp_path: Path) -> None:
    inventory = tmp_path / "hosts.yml"
    real = tmp_path / "shared" / "box1.yml"
    real.parent.mkdir()
    real.write_text("---\nplan_polars_threads: 2  # mine\n# The data mount is the NVMe pair.\nplan_trials: 2\n")
    real.chmod(0o600)
    (tmp_path / "host_vars").mkdir()
    (tmp_path / "host_vars" / "box1.yml").symlink_to(real)
    kept = [r for r in _kept() if r.kept]
    for day in ("2026-12-04", "2026-12-05"):
        proposal.write(inventory, "box1", kept, day=day)
    text = real.read_text()
    assert "plan_polars_threads: 1  # mine\n# The data mount is the NVMe pair.\nplan_trials: 2\n" in text, text
    assert oct(real.stat().st_mode & 0o777) == "0o600" and (tmp_path / "host_vars" / "box1.yml").is_symlink()


def test_write_back_creates_the_file_and_refuses_what_it_cannot_write(tmp_path: Path) -> None:
    inventory = tmp_path / "inv"
    inventory.mkdir()
    path = proposal.write(inventory, "box1", [r for r in _kept() if r.kept], day="2026-12-04")
    assert path == inventory / "host_vars" / "box1.yml" and path.read_text().startswith("---\nplan_polars_threads: 1")
    (inventory / "host_vars" / "box3.yml").write_text("- a list\n")
    with pytest.raises(BadInput, match=r"box3.yml is not a mapping of variables"):
        proposal.write(inventory, "box3", [r for r in _kept() if r.kept])
    # host_vars is a file here: nothing can be written below it.
    blocked = tmp_path / "blocked"
    blocked.mkdir()
    (blocked / "host_vars").write_text("not a directory\n")
    with pytest.raises(BadInput, match=r"--write cannot write .*blocked/host_vars/box1.yml \(.*host_vars is not a directory\)"):
        proposal.check_writable(blocked / "hosts.yml", ["box1"])
    proposal.check_writable(inventory, ["box1", "box2"])
    # A file it could not edit is refused before any host is measured: a vault, several documents.
    (inventory / "host_vars" / "box4.yml").write_text("$ANSIBLE_VAULT;1.1;AES256\n6162636465\n")
    (inventory / "host_vars" / "box5.yml").write_text("---\na: 1\n---\nb: 2\n")
    for host in ("box3", "box4", "box5"):
        with pytest.raises(BadInput, match=rf"box{host[-1]}.yml"):
            proposal.check_writable(inventory, [host])


def _ansible_vars(inventory: Path, hosts: list[str]) -> dict[str, dict[str, Any]]:
    """Each host's variables as Ansible itself reads them from INVENTORY (its group_vars and host_vars)."""
    from ansible.inventory.manager import InventoryManager
    from ansible.parsing.dataloader import DataLoader
    from ansible.vars.manager import VariableManager

    loader = DataLoader()
    manager = InventoryManager(loader=loader, sources=[str(inventory)])
    variables = VariableManager(loader=loader, inventory=manager)
    return {host: variables.get_vars(host=manager.get_host(host)) for host in hosts}


YAML_INVENTORY = """\
---
# The training racks.
all:
  children:
    racks:
      hosts:
        box1:
          ansible_host: 10.0.0.1  # rack 4
        box2:
          ansible_host: 10.0.0.2
        box3:
          ansible_host: 10.0.0.3
"""
INI_INVENTORY = (
    "# the racks\n[racks]\nbox1 ansible_host=10.0.0.1\nbox2 ansible_host=10.0.0.2\nbox3 ansible_host=10.0.0.3\n\n"
    "[racks:vars]\nansible_user=root\n"
)
PRINT = "abc123abc123"


def _measured() -> list[proposal.Row]:
    """The measured host's rows (box1): polars_threads kept at 1, the DataLoader's rule stays."""
    return _kept("box1")


def _inventory(tmp_path: Path, kind: str) -> tuple[Path, Path]:
    """An inventory of KIND (yaml, ini, dir) with box1-3, and the file a class's group goes into."""
    if kind == "dir":
        inventory = tmp_path / "inv"
        inventory.mkdir()
        (inventory / "hosts.yml").write_text(YAML_INVENTORY)
        return inventory, inventory / classes.CLASSES_FILE
    inventory = tmp_path / ("hosts.yml" if kind == "yaml" else "hosts")
    inventory.write_text(YAML_INVENTORY if kind == "yaml" else INI_INVENTORY)
    return inventory, inventory


@pytest.mark.parametrize("kind", ["yaml", "ini", "dir"])
def test_a_class_goes_into_its_group_which_ansible_gives_every_member(tmp_path: Path, kind: str) -> None:
    """A class of two hosts measured on box1: one group_vars file for the class, the group with both
    members in the inventory (the user's lines byte for byte), read back by Ansible."""
    inventory, edited = _inventory(tmp_path, kind)
    original = "" if kind == "dir" else inventory.read_text()
    assert classes.kind(inventory) == kind
    written, said = proposal.write_class(inventory, PRINT, _measured(), ["box1", "box2"], day="2026-12-05")
    group_vars = (inventory if kind == "dir" else tmp_path) / "group_vars" / "hw_abc123abc123.yml"
    assert written == [group_vars, edited] and said == []
    assert edited.read_text().startswith(original)  # the user's lines as they were
    assert "hosts of one hardware class" in edited.read_text() and "measured on box1" in edited.read_text()
    got = _ansible_vars(inventory, ["box1", "box2", "box3"])
    for host in ("box1", "box2"):
        assert got[host]["plan_polars_threads"] == 1, got[host]
        assert got[host]["plan_tuned"]["polars_threads"].endswith("2026-12-05, measured on box1)"), got[host]["plan_tuned"]
        assert got[host]["ansible_host"].startswith("10.0.0.")
    assert "plan_polars_threads" not in got["box3"]
    # Written again (a later tune of the same class): the group is not repeated.
    before = edited.read_text()
    again, _ = proposal.write_class(inventory, PRINT, _measured(), ["box1", "box2"], day="2026-12-05")
    assert again == [group_vars] and edited.read_text() == before
    # A new member of the class joins the group; the others stay listed once.
    proposal.write_class(inventory, PRINT, _measured(), ["box1", "box2", "box3"], day="2026-12-06")
    assert _ansible_vars(inventory, ["box3"])["box3"]["plan_polars_threads"] == 1
    assert edited.read_text().startswith(original) and edited.read_text().count("box2") == before.count("box2")


def test_a_host_whose_hardware_changed_leaves_its_old_class_and_a_removed_one_leaves_every_class(tmp_path: Path) -> None:
    inventory, _ = _inventory(tmp_path, "yaml")
    proposal.write_class(inventory, PRINT, _measured(), ["box1", "box2", "box3"], day="2026-12-05")
    # box2 and box3 got more memory: a class of their own now, measured on box2 (polars_threads 2).
    other = [replace(r, tuned=2) if r.kept else r for r in _kept("box2")]
    proposal.write_class(inventory, "def456def456", other, ["box2", "box3"], day="2026-12-06")
    got = _ansible_vars(inventory, ["box1", "box2", "box3"])
    assert [got[h]["plan_polars_threads"] for h in ("box1", "box2", "box3")] == [1, 2, 2]
    # The user takes box3 out of the inventory: no class's group keeps it defined.
    inventory.write_text(inventory.read_text().replace("        box3:\n          ansible_host: 10.0.0.3\n", ""))
    proposal.write_class(inventory, "def456def456", other, ["box1", "box2"], day="2026-12-07")
    from ansible.inventory.manager import InventoryManager
    from ansible.parsing.dataloader import DataLoader

    assert sorted(InventoryManager(loader=DataLoader(), sources=[str(inventory)]).hosts) == ["box1", "box2"]
    assert "hw_abc123abc123" not in inventory.read_text()  # its last member moved: the empty group is gone


def test_a_member_outside_limit_keeps_the_group_and_is_named(tmp_path: Path) -> None:
    inventory, _ = _inventory(tmp_path, "ini")
    proposal.write_class(inventory, PRINT, _measured(), ["box1", "box2", "box3"], day="2026-12-05")
    _, said = proposal.write_class(inventory, PRINT, _measured(), ["box1", "box2"], day="2026-12-06")
    assert said == [
        "box3: in group hw_abc123abc123 from an earlier tune and not reached by this one (--limit), they get these values too"
    ]
    assert _ansible_vars(inventory, ["box3"])["box3"]["plan_tuned"]["polars_threads"].endswith("2026-12-06, measured on box1)")


def test_a_value_ansible_ranks_above_the_class_is_named(tmp_path: Path) -> None:
    inventory, _ = _inventory(tmp_path, "yaml")
    inventory.write_text(
        inventory.read_text().replace("ansible_host: 10.0.0.3", "ansible_host: 10.0.0.3\n          plan_polars_threads: 4")
    )
    (tmp_path / "host_vars").mkdir()
    (tmp_path / "host_vars" / "box2.yml").write_text("---\nplan_tuned:\n  trials: 1.1x over the rule's 2 on hpo\n")
    _, said = proposal.write_class(inventory, PRINT, _measured(), ["box1", "box2", "box3"], day="2026-12-05")
    assert said == [
        "box2: a plan_tuned of its own (host_vars) replaces the class's, so `provisioner plan` shows other evidence for "
        "polars_threads; remove plan_tuned there",
        "box3: plan_polars_threads is 4 there, from its host_vars, its inventory line or a deeper group, which Ansible "
        "ranks above group hw_abc123abc123; remove it there to take the tuned value",
    ]


def test_a_member_whose_own_server_option_differs_from_the_measured_hosts_is_named(tmp_path: Path) -> None:
    inventory, _ = _inventory(tmp_path, "yaml")
    inventory.write_text(
        inventory.read_text().replace("ansible_host: 10.0.0.3", "ansible_host: 10.0.0.3\n          plan_serving_workers: 8")
    )
    threads = proposal.Row("box1", "serving", "serving_threads_per_worker", 1, tuned=2, gain=1.2, spread=0.02, pairs=11)
    _, said = proposal.write_class(inventory, PRINT, [threads], ["box1", "box2", "box3"], day="2026-12-05")
    assert said == [
        "box3: plan_serving_workers is 8 there, None on box1, where the model server was measured; its plan gives "
        "another server than the one measured, or refuses it: set it as on box1, or tune box3 on its own"
    ]
    # Nothing said where the class keeps no count of the server's.
    _, said = proposal.write_class(inventory, PRINT, _measured(), ["box1", "box2", "box3"], day="2026-12-05")
    assert not [m for m in said if "model server" in m]
    # An inventory that takes no group (each member's host_vars written): the same said, a bound too.
    other = tmp_path / "other"
    other.mkdir()
    (other / "hosts.json").write_text(json.dumps({"all": {"hosts": {"box1": None, "box2": None}}}))
    (other / "host_vars").mkdir()
    (other / "host_vars" / "box2.yml").write_text("---\nplan_serving_memory_share: 0.2\n")
    _, said = proposal.write_class(other / "hosts.json", PRINT, [threads], ["box1", "box2"], day="2026-12-05")
    assert said[1:] == [
        "box2: plan_serving_memory_share is 0.2 there, None on box1, where the model server was measured; its plan "
        "gives another server than the one measured, or refuses it: set it as on box1, or tune box2 on its own"
    ], said
    # A kept allocator, where a member's own serving_jemalloc outranks the plan there.
    third = tmp_path / "third"
    (third / "host_vars").mkdir(parents=True)
    (third / "hosts.json").write_text((other / "hosts.json").read_text())
    (third / "host_vars" / "box2.yml").write_text("---\nserving_jemalloc: true\n")
    allocator = proposal.Row("box1", "serving", "serving_allocator", "glibc", tuned="jemalloc", gain=1.1, spread=0.02, pairs=11)
    _, said = proposal.write_class(third / "hosts.json", PRINT, [allocator], ["box1", "box2"], day="2026-12-05")
    assert said[1:] == [
        "box2: serving_jemalloc is True there, None on box1, where the model server was measured; its plan gives "
        "another server than the one measured, or refuses it: set it as on box1, or tune box2 on its own"
    ], said


@pytest.mark.parametrize(
    ("name", "text", "mode", "kind"),
    [
        ("hosts", YAML_INVENTORY, 0o644, "yaml"),  # YAML without a suffix
        ("hosts.yml", YAML_INVENTORY, 0o755, "yaml"),  # a YAML file with the x bit (a checkout's mode)
        ("hosts.ini", INI_INVENTORY, 0o644, "ini"),
        ("inventory.py", "#!/usr/bin/env python3\nprint('{}')\n", 0o755, "other"),
        ("aws_ec2.yml", "---\nplugin: amazon.aws.aws_ec2\n", 0o644, "other"),
        ("hosts.json", json.dumps({"all": {"hosts": {"box1": None, "box2": None}}}), 0o644, "other"),
        ("hosts.toml", "[racks.hosts]\nbox1 = {}\nbox2 = {}\n", 0o644, "other"),
        ("hosts.vault", "$ANSIBLE_VAULT;1.1;AES256\n6162636465\n", 0o644, "other"),
    ],
)
def test_an_inventory_that_takes_no_group_gives_each_member_host_vars(
    tmp_path: Path, name: str, text: str, mode: int, kind: str
) -> None:
    inventory = tmp_path / name
    inventory.write_text(text)
    inventory.chmod(mode)
    assert classes.kind(inventory) == kind
    written, said = proposal.write_class(inventory, PRINT, _measured(), ["box1", "box2"], day="2026-12-05")
    if kind != "other":
        assert "hw_abc123abc123" in inventory.read_text()
        return
    assert inventory.read_text() == text  # left as it was
    assert written == [tmp_path / "host_vars" / "box1.yml", tmp_path / "host_vars" / "box2.yml"]
    assert len(said) == 1 and said[0].endswith("each member's host_vars got the values instead"), said
    # The measured host's evidence is its own; the other's names the host measured.
    assert "measured on" not in written[0].read_text() and "measured on box1)" in written[1].read_text()


def test_a_reached_host_whose_class_changed_leaves_its_old_group_whatever_its_new_class_kept(tmp_path: Path) -> None:
    inventory, _ = _inventory(tmp_path, "yaml")
    proposal.write_class(inventory, PRINT, _measured(), ["box1", "box2", "box3"], day="2026-12-05")
    # box3's hardware changed: a class of its own (host_vars only, or nothing kept), every host reached.
    placement = {"box1": "hw_abc123abc123", "box2": "hw_abc123abc123", "box3": "hw_def456def456"}
    said = proposal.prune(inventory, placement)
    assert said == [f"{inventory}: the classes' groups follow the hosts' hardware now"]
    got = _ansible_vars(inventory, ["box1", "box3"])
    assert got["box1"]["plan_polars_threads"] == 1 and "plan_polars_threads" not in got["box3"]
    assert proposal.prune(inventory, placement) == []  # nothing left to move
    # An inventory tune never grouped: nothing to do.
    (tmp_path / "p").mkdir()
    plain, _ = _inventory(tmp_path / "p", "ini")
    assert proposal.prune(plain, placement) == [] and plain.read_text() == INI_INVENTORY


def test_a_line_of_the_users_in_a_class_block_is_never_rewritten(tmp_path: Path) -> None:
    inventory, _ = _inventory(tmp_path, "ini")
    proposal.write_class(inventory, PRINT, _measured(), ["box1", "box2"], day="2026-12-05")
    with inventory.open("a") as f:  # a host appended at the end of the file lands in the class's section
        f.write("newbox ansible_host=10.0.0.9 ansible_user=admin\n")
    text = inventory.read_text()
    written, said = proposal.write_class(inventory, PRINT, _measured(), ["box1", "box2", "box3"], day="2026-12-06")
    assert inventory.read_text() == text  # the user's line kept, the file as it was
    assert written == [tmp_path / "host_vars" / f"box{i}.yml" for i in (1, 2, 3)]
    assert "holds a line tune did not write ('newbox ansible_host=10.0.0.9 ansible_user=admin')" in said[0], said
    assert proposal.prune(inventory, {"box1": "hw_x"})[0].startswith("the classes' groups were left as they were")


def test_crlf_lines_stay_as_they_were(tmp_path: Path) -> None:
    inventory = tmp_path / "hosts"
    inventory.write_bytes(INI_INVENTORY.replace("\n", "\r\n").encode())
    proposal.write_class(inventory, PRINT, _measured(), ["box1", "box2"], day="2026-12-05")
    assert inventory.read_bytes().startswith(INI_INVENTORY.replace("\n", "\r\n").encode())
    assert _ansible_vars(inventory, ["box2"])["box2"]["plan_polars_threads"] == 1


def test_what_ansible_refuses_to_read_is_said_not_raised(tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> None:
    from ansible import constants

    # A YAML file that ends its document: a group after it is not read, and Ansible set to fail on it.
    monkeypatch.setattr(constants, "INVENTORY_ANY_UNPARSED_IS_FAILED", True)
    ended = tmp_path / "ended.yml"
    ended.write_text("---\nall:\n  hosts:\n    box1:\n    box2:\n...\n")
    written, said = proposal.write_class(ended, PRINT, _measured(), ["box1", "box2"], day="2026-12-05")
    assert ended.read_text() == "---\nall:\n  hosts:\n    box1:\n    box2:\n...\n"
    assert written == [tmp_path / "host_vars" / "box1.yml", tmp_path / "host_vars" / "box2.yml"] and said, said
    monkeypatch.undo()
    # A vaulted vars file (no vault password on the control node's side of tune): the read-back says so.
    (tmp_path / "v").mkdir()
    inventory, _ = _inventory(tmp_path / "v", "yaml")
    (inventory.parent / "group_vars" / "all").mkdir(parents=True)
    (inventory.parent / "group_vars" / "all" / "vault.yml").write_text("$ANSIBLE_VAULT;1.1;AES256\n" + "3132" * 20 + "\n")
    written, said = proposal.write_class(inventory, PRINT, _measured(), ["box1", "box2"], day="2026-12-05")
    assert written[0].name == "hw_abc123abc123.yml"
    assert any(m.startswith("the hosts' variables could not be read back (") for m in said), said


def test_write_for_a_fleet_is_refused_where_a_class_could_not_be_written(tmp_path: Path) -> None:
    inventory, _ = _inventory(tmp_path, "yaml")
    proposal.check_writable(inventory, ["box1", "box2"])
    proposal.check_class_writable(inventory, {PRINT: ["box1", "box2"], "def456def456": ["box3"]})
    # The class's group_vars file is one it could not edit.
    (tmp_path / "group_vars").mkdir()
    (tmp_path / "group_vars" / "hw_abc123abc123.yml").write_text("- a list\n")
    with pytest.raises(BadInput, match=r"hw_abc123abc123.yml is not a mapping of variables"):
        proposal.check_class_writable(inventory, {PRINT: ["box1", "box2"]})
    proposal.check_class_writable(inventory, {PRINT: ["box1"]})  # a class of one: its host_vars only
    # An inventory directory whose classes file cannot be written (a directory in its place).
    (tmp_path / "d").mkdir()
    directory, classes_file = _inventory(tmp_path / "d", "dir")
    classes_file.mkdir()
    with pytest.raises(BadInput, match=rf"--write cannot write {classes_file} "):
        proposal.check_class_writable(directory, {PRINT: ["box1", "box2"]})


def test_a_second_tune_on_the_host_is_refused_while_one_runs(tmp_path: Path) -> None:
    inner = driver.locked(str(tmp_path), lambda: driver.locked(str(tmp_path), lambda: {"ran": True}))
    assert inner["refused"].startswith("another tune is running on this host (pid ")
    assert driver.locked(str(tmp_path), lambda: {"ran": True}) == {"ran": True}


def test_a_run_whose_starter_went_away_stops_with_its_pairs_kept(tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> None:
    box = Box({"POLARS_MAX_THREADS": "1"}, gain=1.25)
    ppid = iter([100] + [100] * 6 + [1] * 1000)  # the starter's shell ends after a few pairs
    monkeypatch.setattr(driver.os, "getppid", lambda: next(ppid))
    spec = {"workloads": ["features", "dataloader"], "knobs": [], "budget_s": 10_000}
    out = driver.run(box, spec, ledger=driver.Ledger(str(tmp_path)), clock=box.clock)
    assert "interrupted" in out["stopped"] and list(out["workloads"]) == ["features"]
    cand = out["workloads"]["features"]["knobs"]["polars_threads"]["candidates"][0]
    assert 1 <= len(cand["ratios"]) < pairs.MAX_PAIRS and not cand["kept"]


# ---------------------------------------------------------------- the command, engine faked


def _kept_result(value: int = 1) -> dict[str, Any]:
    return {
        "cores": 2,
        "seconds": 90.0,
        "workloads": {
            "features": {
                "knobs": {
                    "polars_threads": {
                        "rule": 2,
                        "candidates": [{"value": value, "label": str(value), "kept": True, "ratios": [1.3] * 11}],
                        "tuned": {"value": value, "label": str(value), "gain": 1.3, "spread": 0.02, "pairs": 11},
                    }
                }
            }
        },
    }


class Fleet:
    """engine.run_playbook faked: facts.yml gives three hosts' hardware (a and b alike), tune.yml the
    measured hosts' results; records what ran on which hosts."""

    def __init__(self, monkeypatch: pytest.MonkeyPatch, tmp_path: Path, results: dict[str, Any]):
        from provisioner import engine
        from provisioner.runs import HostResult, RunResult

        self.ran: list[tuple[str, str | None]] = []
        self.inventory = tmp_path / "hosts.yml"
        self.inventory.write_text("all: {hosts: {a: {}, b: {}, c: {}}}\n")
        hardware = {"a": _facts("xeon_2s"), "b": _facts("xeon_2s"), "c": _facts("vm_2vcpu")}

        def run_playbook(playbook: str, inventory: Path, **kwargs: Any) -> RunResult:
            self.ran.append((playbook, kwargs.get("limit")))
            hosts = list(hardware) if playbook == "facts.yml" else kwargs["limit"].split(",")
            if playbook == "facts.yml":
                facts = {h: {"provisioner_hardware": hardware[h]} for h in hosts}
            else:
                facts = {h: {"smoke_tune_result": results[h]} for h in hosts if h in results}
            return RunResult(playbook, False, 0, {h: HostResult(h, ok=2) for h in hosts}, facts, [], Path("/x"), 1.0)

        monkeypatch.setattr(engine, "run_playbook", run_playbook)


def test_one_host_per_hardware_class_is_measured_and_its_group_written(monkeypatch: pytest.MonkeyPatch, tmp_path: Path) -> None:
    from provisioner import commands

    put_back = [f"{knobs.THP_ENABLED} back to madvise"]
    fleet = Fleet(monkeypatch, tmp_path, {"a": _kept_result(1), "c": {"cores": 2, "workloads": {}, "put_back": put_back}})
    # Without --write: the proposal only, no file.
    proposal_only = commands.tune(fleet.inventory, workloads=["features"], budget="2m", html=tmp_path / "tune.html")
    assert proposal_only.exit_code == 0 and not (tmp_path / "host_vars").exists()
    # What a kernel knob changed is said to have been put back.
    assert f"c: {put_back[0]}" in proposal_only.messages
    fleet.ran.clear()
    result = commands.tune(fleet.inventory, workloads=["features"], budget="2m", write=True, html=tmp_path / "tune.html")
    assert result.exit_code == 0, result
    # The report: each measured host, its candidates' pairs as dots, the class it stood for.
    page = (tmp_path / "tune.html").read_text()
    assert "<h2>a</h2>" in page and "<h2>c</h2>" in page and "measured for b (same hardware)" in page
    assert page.count("<circle") == 11 and "kept: " in page
    assert fleet.ran == [("facts.yml", None), ("tune.yml", "a,c")]
    assert [(r.host, r.tuned, r.measured_on) for r in result.value.rows] == [("a", 1, "a"), ("b", 1, "a")]
    # The class of a and b: one group_vars file and the group in the inventory, no host_vars.
    group = classes.class_group(classes.fingerprint(_facts("xeon_2s")))
    assert result.value.written == [tmp_path / "group_vars" / f"{group}.yml", fleet.inventory]
    assert not (tmp_path / "host_vars").exists()
    for host in ("a", "b"):
        got = _ansible_vars(fleet.inventory, [host])[host]
        assert got["plan_polars_threads"] == 1 and got["plan_tuned"]["polars_threads"].endswith("measured on a)")
    assert "plan_polars_threads" not in _ansible_vars(fleet.inventory, ["c"])["c"]
    assert any("b: same hardware as a" in m for m in result.messages)


def test_a_busy_host_fails_the_run_and_bad_input_touches_no_host(monkeypatch: pytest.MonkeyPatch, tmp_path: Path) -> None:
    from provisioner import commands
    from provisioner.errors import ExitCode

    fleet = Fleet(monkeypatch, tmp_path, {"a": {"refused": "60% of the CPUs were busy"}, "c": {"workloads": {}}})
    result = commands.tune(fleet.inventory, budget="2m", html=tmp_path / "tune.html")
    assert result.exit_code == ExitCode.HOST_FAILED and "a: 60% of the CPUs were busy" in result.messages
    fleet.ran.clear()
    for kwargs in ({"workloads": ["gemm"]}, {"knobs": ["allocator"]}, {"budget": "5s"}):
        with pytest.raises(BadInput):
            commands.tune(fleet.inventory, **kwargs)
    assert fleet.ran == []


def test_a_changed_set_of_candidates_starts_a_study_of_its_own(tmp_path: Path) -> None:
    box = Box({}, gain=1.0)
    box.cpu = {"physical_cores": 2, "logical_cpus": 4}
    spec = {"workloads": ["features"], "knobs": ["polars_threads"], "budget_s": 10_000}
    driver.run(box, spec, ledger=driver.Ledger(str(tmp_path)), clock=box.clock)
    out = driver.run(box, {**spec, "allow_oversubscription": True}, ledger=driver.Ledger(str(tmp_path)), clock=box.clock)
    labels = [c["label"] for c in out["workloads"]["features"]["knobs"]["polars_threads"]["candidates"]]
    assert labels == ["1", "4 (library default)"]


def test_a_hang_up_stops_the_run_at_the_next_pair(tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> None:
    box = Box({}, gain=1.0)
    worker = box.worker

    def hung_up_after_three(task: str, env: Any = None, **extra: Any) -> dict[str, Any]:
        if len(box.runs) == 6:
            driver.hang_up()
        return worker(task, env, **extra)

    monkeypatch.setattr(driver, "HUNG_UP", False)
    monkeypatch.setattr(box, "worker", hung_up_after_three)
    out = driver.run(
        box, {"workloads": ["features", "dataloader"], "budget_s": 10_000}, ledger=driver.Ledger(str(tmp_path)), clock=box.clock
    )
    # The pair under way when the session ended is finished (its two figures kept), no other begins.
    assert "interrupted" in out["stopped"] and len(box.runs) == 8 and list(out["workloads"]) == ["features"]


# ---------------------------------------------------------------- a kernel knob: set live, put back


def sysfs(tmp_path: Path) -> tuple[Path, Path]:
    """A fake root whose THP file says madvise, as a kernel's does (the chosen mode in brackets)."""
    root = tmp_path / "root"
    thp = root / knobs.THP_ENABLED.lstrip("/")
    thp.parent.mkdir(parents=True)
    thp.write_text("always [madvise] never\n")
    return root, thp


THP_SPEC = {"workloads": ["triad"], "knobs": ["thp_enabled"], "budget_s": 10_000}


def test_a_kernel_knob_is_set_for_each_measurement_and_put_back(tmp_path: Path) -> None:
    root, thp = sysfs(tmp_path)
    box = Box({"THP": "always"}, gain=1.25, thp=thp)
    state = tmp_path / "state"
    out = driver.run(box, THP_SPEC, ledger=driver.Ledger(str(state)), clock=box.clock, live=driver.Live(str(state), str(root)))
    record = out["workloads"]["triad"]["knobs"]["thp_enabled"]
    assert record["rule"] == "madvise" and record["tuned"]["value"] == "always", record
    never = next(c for c in record["candidates"] if c["value"] == "never")
    assert never["decided"] and not never["kept"]
    # Each side ran under its own mode, written before it started: the rule's and the candidates'.
    assert {r["THP"] for r in box.runs} == {"madvise", "always", "never"}
    assert [r["THP"] for r in box.runs[:4]] in (["madvise", "always"] * 2, ["madvise", "always", "always", "madvise"])
    # The file says what it said before, and the journal is gone.
    assert live.current(thp.read_text()) == "madvise" and out["put_back"] == [f"{knobs.THP_ENABLED} back to madvise"]
    assert not (state / live.JOURNAL).exists()


def test_an_interrupted_run_puts_the_kernel_back(tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> None:
    root, thp = sysfs(tmp_path)
    box = Box({}, gain=1.0, thp=thp)
    worker = box.worker

    at_interrupt: list[str] = []

    def interrupted_in_the_first_candidate(task: str, env: Any = None, **extra: Any) -> dict[str, Any]:
        if len(box.runs) == 1:  # the rule's run done, the candidate's mode written for its own
            at_interrupt.append(live.current(thp.read_text()))
            raise KeyboardInterrupt  # SIGINT (SIGTERM ends the run the same way: its handler raises)
        return worker(task, env, **extra)

    monkeypatch.setattr(box, "worker", interrupted_in_the_first_candidate)
    state = tmp_path / "state"
    with pytest.raises(KeyboardInterrupt):
        driver.run(box, THP_SPEC, ledger=driver.Ledger(str(state)), clock=box.clock, live=driver.Live(str(state), str(root)))
    assert at_interrupt == ["always"], "the run was to be stopped under another mode than the plan's"
    assert live.current(thp.read_text()) == "madvise" and not (state / live.JOURNAL).exists()


def test_the_workloads_after_a_kernel_knob_run_under_the_mode_from_before(tmp_path: Path) -> None:
    root, thp = sysfs(tmp_path)
    box = Box({}, gain=1.0, thp=thp)
    state = tmp_path / "state"
    spec = {"workloads": ["triad", "features"], "knobs": [], "budget_s": 10_000}
    driver.run(box, spec, ledger=driver.Ledger(str(state)), clock=box.clock, live=driver.Live(str(state), str(root)))
    features = [r for r in box.runs if "POLARS_MAX_THREADS" in r]
    assert features and {r["THP"] for r in features} == {"madvise"}, "a later workload ran under the last candidate's mode"


def test_the_defrag_policy_is_searched_under_the_plans_mode_when_no_mode_is_kept(tmp_path: Path) -> None:
    root, thp = sysfs(tmp_path)  # the kernel says madvise, the plan always (not applied live)
    defrag = root / knobs.THP_DEFRAG.lstrip("/")
    defrag.write_text("always defer defer+madvise [madvise] never\n")
    box = Box({}, gain=1.0, thp=thp)
    box.plan.update(thp_enabled="always", thp_defrag="madvise")
    seen: list[tuple[str, str]] = []
    worker = box.worker

    def both(task: str, env: Any = None, **extra: Any) -> dict[str, Any]:
        seen.append((live.current(thp.read_text()), live.current(defrag.read_text())))
        return worker(task, env, **extra)

    box.worker = both  # type: ignore[method-assign]
    state = tmp_path / "state"
    spec = {"workloads": ["triad"], "knobs": [], "budget_s": 10_000}
    out = driver.run(box, spec, ledger=driver.Ledger(str(state)), clock=box.clock, live=driver.Live(str(state), str(root)))
    knobs_out = out["workloads"]["triad"]["knobs"]
    assert knobs_out["thp_enabled"]["tuned"] is None and knobs_out["thp_defrag"]["tuned"] is None
    assert {"always", "defer", "defer+madvise", "never"} <= {p for _, p in seen}, seen
    # Every defrag candidate ran under the plan's mode, none under the kernel's madvise from before.
    assert {m for m, p in seen if p != "madvise"} == {"always"}, seen
    # Both files say what they said before the run.
    assert (live.current(thp.read_text()), live.current(defrag.read_text())) == ("madvise", "madvise")


@pytest.mark.parametrize("how", ["kept", "the kernel's"])
def test_the_defrag_policy_is_not_searched_under_thps_mode_never(tmp_path: Path, how: str) -> None:
    root, thp = sysfs(tmp_path)
    defrag = root / knobs.THP_DEFRAG.lstrip("/")
    defrag.write_text("always defer defer+madvise [madvise] never\n")
    # never wins the mode's search, or is the kernel's mode when the mode is not searched (what the
    # defrag policy's measurements would then run under, whatever the plan says).
    box = Box({"THP": "never"} if how == "kept" else {}, gain=1.25, thp=thp)
    box.plan.update(thp_defrag="madvise", thp_enabled="madvise")
    if how != "kept":
        thp.write_text("always madvise [never]\n")
    state = tmp_path / "state"
    spec = {
        "workloads": ["triad"],
        "knobs": ["thp_enabled", "thp_defrag"] if how == "kept" else ["thp_defrag"],
        "budget_s": 10_000,
    }
    out = driver.run(box, spec, ledger=driver.Ledger(str(state)), clock=box.clock, live=driver.Live(str(state), str(root)))
    knobs_out = out["workloads"]["triad"]["knobs"]
    if how == "kept":
        assert knobs_out["thp_enabled"]["tuned"]["value"] == "never"
    assert knobs_out["thp_defrag"] == {
        "skipped": "THP's mode is never here: no huge page is faulted in, so the defrag policy moves nothing"
    }
    assert live.current(defrag.read_text()) == "madvise"
    # The plan's never with the kernel's mode still madvise (not applied live): measured under madvise.
    thp.write_text("always [madvise] never\n")
    box.plan.update(thp_enabled="never")
    other = driver.run(
        box,
        {**spec, "knobs": ["thp_defrag"]},
        ledger=driver.Ledger(str(tmp_path / "s2")),
        clock=box.clock,
        live=driver.Live(str(tmp_path / "s2"), str(root)),
    )
    assert "skipped" not in other["workloads"]["triad"]["knobs"]["thp_defrag"]


def test_a_run_killed_outright_is_put_right_by_the_next_one(tmp_path: Path) -> None:
    root, thp = sysfs(tmp_path)
    state = tmp_path / "state"
    killed = driver.Live(str(state), str(root))
    killed.set(((knobs.THP_ENABLED, "never"),))  # SIGKILL now: no finally runs
    assert live.current(thp.read_text()) == "never" and (state / live.JOURNAL).exists()
    box = Box({}, gain=1.0, thp=thp)
    spec = {"workloads": ["features"], "knobs": [], "budget_s": 200}
    out = driver.run(box, spec, ledger=driver.Ledger(str(state)), clock=box.clock, live=driver.Live(str(state), str(root)))
    assert out["restored"] == [f"{knobs.THP_ENABLED} back to madvise, as it was before a tune run that did not end (its journal)"]
    # Put back before the first measurement: every run saw the host as the plan left it.
    assert {r["THP"] for r in box.runs} == {"madvise"}
    assert live.current(thp.read_text()) == "madvise" and not (state / live.JOURNAL).exists()


def test_a_journal_keeps_what_it_could_not_put_back_and_leaves_a_mode_set_since(tmp_path: Path) -> None:
    root, thp = sysfs(tmp_path)
    state = tmp_path / "state"
    killed = driver.Live(str(state), str(root))
    killed.set(((knobs.THP_ENABLED, "never"),))  # killed here
    # `provisioner up` (or a person) set a mode since, one the killed run never wrote: it stays.
    thp.write_text("always")
    said = driver.Live(str(state), str(root)).recover()
    assert said == [f"{knobs.THP_ENABLED} left at always: set since the tune run that did not end (its journal named madvise)"]
    assert live.current(thp.read_text()) == "always" and not (state / live.JOURNAL).exists()
    # A value that cannot be put back stays in the journal, for this run's end and the next run.
    killed = driver.Live(str(state), str(root))
    killed.set(((knobs.THP_ENABLED, "never"),))
    thp.unlink()
    thp.mkdir()  # unreadable as a file now
    again = driver.Live(str(state), str(root))
    assert "could not be put back to always" in again.recover()[0] and (state / live.JOURNAL).exists()
    thp.rmdir()
    thp.write_text("never")
    assert again.restore() == [f"{knobs.THP_ENABLED} back to always"] and not (state / live.JOURNAL).exists()
    assert live.current(thp.read_text()) == "always"


def test_a_kernel_file_that_cannot_be_written_is_not_searched(tmp_path: Path) -> None:
    box = Box({}, gain=1.0)
    state = tmp_path / "state"
    # No such file under this root (a kernel without THP; a container's read-only /sys says EROFS).
    out = driver.run(
        box, THP_SPEC, ledger=driver.Ledger(str(state)), clock=box.clock, live=driver.Live(str(state), str(tmp_path / "none"))
    )
    skipped = out["workloads"]["triad"]["knobs"]["thp_enabled"]["skipped"]
    assert skipped.startswith(f"{knobs.THP_ENABLED} cannot be written here (No such file or directory)"), skipped
    assert "the plan's value stays" in skipped and not box.runs
    # Without the kernel's settings in the run's hands, the same.
    out = driver.run(box, THP_SPEC, ledger=driver.Ledger(str(state)), clock=box.clock)
    assert "no kernel setting" in out["workloads"]["triad"]["knobs"]["thp_enabled"]["skipped"] and not box.runs


def test_a_role_variable_set_for_the_host_outranks_its_plan_value() -> None:
    """What roles/smoke hands the host (the role variables set for it) -> the knobs not searched, each with
    the variable and the value it gives (None: another count, the plan's value stays)."""
    assert knobs.outranked({}) == {}
    assert knobs.outranked({"serving_jemalloc": False, "thread_env_arrow_io_threads": "16", "thread_env_trials": 3}) == {
        "serving_allocator": ["serving_jemalloc", "glibc"],
        "arrow_io_threads": ["thread_env_arrow_io_threads", 16],
        "trials": ["thread_env_trials", 3],
    }
    assert knobs.outranked({"serving_jemalloc": "yes"})["serving_allocator"] == ["serving_jemalloc", "jemalloc"]
    # role thread_env's thread count gives Polars', joblib's and the DataLoader's counts; its DataLoader
    # threads give the split; a pool's own variable comes first.
    got = knobs.outranked({"thread_env_threads": "8", "thread_env_polars_threads": 4, "thread_env_dataloader_threads": 2})
    assert got == {
        "polars_threads": ["thread_env_polars_threads", 4],
        "joblib_workers": ["thread_env_threads", None],
        "dataloader_workers": ["thread_env_dataloader_threads", None],
    }
    # Every knob of a count role thread_env exports (not the kernel's, not the model server's shape) is covered.
    exported = {
        k for k, knob in knobs.KNOBS.items() if not knob.sysfs and k not in ("serving_workers", "serving_threads_per_worker")
    }
    assert exported == set(knobs.OUTRANKING)


def test_roles_smoke_hands_the_host_every_role_variable_that_outranks_a_knob() -> None:
    import yaml

    source = yaml.safe_load((Path(__file__).resolve().parents[2] / "roles" / "smoke" / "vars" / "main.yml").read_text())
    # The pattern varnames gets: the quoted pieces after the lookup's name, joined.
    regex = re.compile("".join(re.findall(r"'([^']*)'", source["_smoke_role_vars_set"])[1:]))
    named = {n for names in knobs.OUTRANKING.values() for n in names}
    assert {n for n in named if regex.fullmatch(n)} == named
    assert not regex.fullmatch("thread_env_variables") and not regex.fullmatch("serving_workers")

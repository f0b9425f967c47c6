"""The host half of `provisioner tune`: measure each knob's candidates against the plan's rule.

Runs on the host from the smoke zipapp (`tune` subcommand), as root, with the ML environment's
Python: Optuna (component hpo) keeps the study in /var/lib/provisioner/tune/studies.db, so an
interrupted run resumes where it stopped, its measured pairs kept. Each measurement is one run of
the workload's worker at the quick size with tune=True, as the ML user in a login shell, the
knob's variables set on top of what the shell gives (provisioner.tune.knobs): the user's path.

Per workload, knob after knob (the order its KNOBS give): every candidate is measured in pairs
against the rule (provisioner.tune.pairs), and the kept candidate with the highest gain becomes
the value both sides run with for the knobs after it. The budget is wall-clock: a pair is begun
only when the time it took so far still fits; a candidate the budget cut short is undecided, never
kept, and resumes at the next run. Standard library at the top: Optuna is imported where the
study is opened.
"""

from __future__ import annotations

import hashlib
import json
import os
import signal
import time
from collections.abc import Callable
from typing import Any

from . import knobs as knob_table
from . import pairs
from .live import Live

STATE_DIR = "/var/lib/provisioner/tune"
STUDIES = "studies.db"
BUSY_SHARE = 0.25  # the share of the CPUs busy before the run above which the host is refused
HUNG_UP = False  # set by SIGHUP: the session that started the run ended (hang_up)


def hang_up(_signum: int = 0, _frame: Any = None) -> None:
    """SIGHUP's handler: the terminal of the ssh session that ran tune closed (Ctrl-C on the control
    node, a lost connection); the run stops at the next pair instead of dying inside one."""
    global HUNG_UP
    HUNG_UP = True


class Ledger:
    """The Optuna studies: one per (workload, knob, context), one trial per candidate, its pairs'
    ratios in the trial's user attributes as they are measured."""

    def __init__(self, state_dir: str):
        import optuna

        optuna.logging.set_verbosity(optuna.logging.WARNING)
        os.makedirs(state_dir, mode=0o700, exist_ok=True)
        self.optuna = optuna
        self.storage = f"sqlite:///{os.path.join(state_dir, STUDIES)}"

    def study(self, name: str) -> Any:
        return self.optuna.create_study(study_name=name, storage=self.storage, load_if_exists=True, direction="maximize")

    def earlier(self, study: Any, label: str) -> tuple[dict[str, Any] | None, list[float]]:
        """A finished verdict on LABEL from an earlier run, else the most pairs an unfinished one measured."""
        state = self.optuna.trial.TrialState
        done: dict[str, Any] | None = None
        partial: list[float] = []
        for t in study.get_trials(deepcopy=False):
            if t.params.get("value") != label:
                continue
            if t.state == state.COMPLETE:
                done = dict(t.user_attrs)
            elif len(t.user_attrs.get("ratios", [])) > len(partial):
                partial = list(t.user_attrs["ratios"])
            if t.state == state.RUNNING:  # a run that stopped without a word (killed, a lost host)
                study.tell(t.number, state=state.FAIL)
        return done, partial

    def begin(self, study: Any, label: str, labels: list[str]) -> Any:
        dist = self.optuna.distributions.CategoricalDistribution(labels)
        study.enqueue_trial({"value": label})
        return study.ask({"value": dist})

    def finish(self, study: Any, trial: Any, verdict: pairs.Verdict | None, decided: bool) -> None:
        if verdict is not None:
            # What a later run shows for it without measuring again (resumed).
            for key, value in (
                ("kept", verdict.kept),
                ("reason", verdict.reason),
                ("gain", verdict.gain),
                ("spread", verdict.spread),
                ("decided", decided),
            ):
                trial.set_user_attr(key, value)
        state = self.optuna.trial.TrialState
        if decided and verdict is not None:
            study.tell(trial, verdict.gain)
        else:
            study.tell(trial, state=state.FAIL)


def context_key(**parts: Any) -> str:
    return hashlib.sha256(json.dumps(parts, sort_keys=True).encode()).hexdigest()[:10]


class _Search:
    """One tune run on this host: the runner's workers, the study, the clock and what the budget has left."""

    def __init__(
        self, runner: Any, ledger: Ledger, clock: Callable[[], float], budget: float, spec: dict[str, Any], live: Live | None
    ):
        self.runner, self.ledger, self.clock, self.budget = runner, ledger, clock, budget
        self.live = live  # the kernel's settings the run changes and puts back (None: a kernel knob is not searched)
        self.started = clock()
        self.cores = int(runner.cpu["physical_cores"])
        self.logical = int(runner.cpu.get("logical_cpus") or self.cores)
        self.oversubscribe = bool(spec.get("allow_oversubscription"))
        self.pair_s: dict[str, float] = {}  # the longest pair so far, per workload
        # Interrupted on the control node (Ctrl-C, a lost connection), the ssh session that ran this
        # ends and this process is handed to init: it stops at the next pair, its pairs kept.
        self.parent = os.getppid()
        self.stopped = ""

    def may_go_on(self, workload: str) -> bool:
        if os.getppid() != self.parent or HUNG_UP:
            self.stopped = "the run that started tune ended (interrupted?): stopped, the pairs measured are kept"
            return False
        # A workload's first pair: the longest of any workload so far stands for it.
        pair = self.pair_s.get(workload, max(self.pair_s.values(), default=0.0))
        return self.clock() - self.started + pair <= self.budget

    def measure(self, workload: str, objective: Any, env: knob_table.Env, live: knob_table.Live = ()) -> float:
        if self.live is not None and (live or self.live.original):
            # The values from before the run under the side's own: a kernel knob searched earlier
            # (another workload's) is never left at its last candidate for the measurements after it.
            self.live.set(with_live(tuple(self.live.original.items()), live))
        from ..smoke.workloads import BY_NAME

        # A workload with a root-parent step (the model server, the Parquet scan's cold cache) measures a
        # candidate there, else its worker does.
        tune_drive = getattr(BY_NAME[workload], "tune_drive", None)
        if tune_drive:
            result = tune_drive(self.runner, knob_table.planned(env, self.runner.plan, self.cores), env)
        else:
            result = self.runner.worker(workload, tune=True, env=env)
        if "error" in result or "skipped" in result:
            raise RuntimeError(result.get("error") or result.get("skipped"))
        return float(objective.figure(result))

    def candidate(
        self,
        workload: str,
        objective: Any,
        rule: tuple[knob_table.Env, knob_table.Live],
        cand: tuple[knob_table.Env, knob_table.Live],
        partial: list[float],
        trial: Any,
    ) -> tuple[pairs.Verdict | None, bool, list[dict[str, float]]]:
        """The pairs of one candidate against the rule (each side: its variables and kernel settings),
        each pair's figures, resumed from PARTIAL."""
        figures: list[dict[str, float]] = []
        last = [self.clock()]

        def side(how: tuple[knob_table.Env, knob_table.Live], who: str) -> float:
            value = self.measure(workload, objective, *how)
            if not figures or len(figures[-1]) == 2:
                figures.append({})
            figures[-1][who] = value
            return value

        def on_pair(ratios: list[float]) -> None:
            now = self.clock()
            self.pair_s[workload] = max(self.pair_s.get(workload, 0.0), now - last[0])
            last[0] = now
            trial.set_user_attr("ratios", list(ratios))

        verdict, decided = pairs.compare_within(
            lambda: side(rule, "rule"),
            lambda: side(cand, "candidate"),
            objective.higher_is_better,
            ratios=partial,
            on_pair=on_pair,
            go_on=lambda: self.may_go_on(workload),
        )
        return verdict, decided, figures

    def kernel_context(self, spec: knob_table.Knob, base_live: knob_table.Live) -> knob_table.Live:
        """The kernel settings a kernel knob's measurements run under: those this run set before it,
        and the others' values as the kernel has them now (THP's defrag policy searched without its
        mode runs under the kernel's mode): its study resumes only under the same."""
        if not spec.sysfs or self.live is None:
            return base_live
        now: list[tuple[str, str]] = []
        for other in knob_table.KNOBS.values():
            if other.sysfs and other.sysfs != spec.sysfs and other.sysfs not in dict(base_live):
                try:
                    now.append((other.sysfs, self.live.read(other.sysfs)))
                except OSError:
                    continue
        return with_live(tuple(now), base_live)

    def knob(
        self, workload: str, objective: Any, knob: str, rule: Any, base: knob_table.Env, base_live: knob_table.Live = ()
    ) -> dict[str, Any]:
        """Every candidate of KNOB against the rule (BASE, BASE_LIVE: the values kept for the knobs before it)."""
        spec = knob_table.KNOBS[knob]
        if spec.sysfs:
            why = self.live.unavailable(spec.sysfs) if self.live is not None else "no kernel setting is changed by this run"
            if why:
                return {"skipped": why}
        rule_side = ({**base, **spec.env(rule, self.cores)}, with_live(base_live, spec.live(rule)))
        cands = knob_table.candidates(knob, rule, self.cores, self.logical, self.oversubscribe, base, self.runner.plan)
        # A study resumes only for the same rule, earlier values, cores and code (the archive's name is its sources' hash).
        code = getattr(self.runner, "code", "")
        labels = [c.label for c in cands]
        # The candidates too: Optuna keeps one list of choices per study.
        context = {
            "rule": rule,
            "base": base,
            "cores": self.cores,
            "sizes": self.runner.args.profile,
            "code": code,
            "labels": labels,
        }
        if spec.follows:  # the plan's values its measurements depend on besides the candidate
            context["plan"] = {k: self.runner.plan.get(k) for k in spec.follows}
        key_live = self.kernel_context(spec, base_live)
        key = context_key(**context, **({"live": list(key_live)} if key_live else {}))
        study = self.ledger.study(f"{workload}.{knob}.{key}")
        record: dict[str, Any] = {"rule": rule, "candidates": [], "tuned": None}
        for cand in cands:
            if self.stopped or HUNG_UP:
                break
            done, partial = self.ledger.earlier(study, cand.label)
            if done is not None:
                record["candidates"].append({"value": cand.value, "label": cand.label, **done, "resumed": True})
                continue
            trial = self.ledger.begin(study, cand.label, labels)
            try:
                cand_side = ({**base, **cand.env}, with_live(base_live, cand.live))
                verdict, decided, figures = self.candidate(workload, objective, rule_side, cand_side, partial, trial)
            except RuntimeError as exc:
                self.ledger.finish(study, trial, None, False)
                record["candidates"].append({"value": cand.value, "label": cand.label, "error": str(exc)})
                continue
            self.ledger.finish(study, trial, verdict, decided)
            record["candidates"].append(
                {
                    "value": cand.value,
                    "label": cand.label,
                    "kept": verdict.kept if verdict else False,
                    "reason": verdict.reason if verdict else "the budget ended before its first pair",
                    "ratios": list(verdict.ratios) if verdict else [],
                    "gain": verdict.gain if verdict else None,
                    "spread": verdict.spread if verdict else None,
                    "decided": decided,
                    "figures": figures,
                }
            )
        kept = [c for c in record["candidates"] if c.get("kept")]
        if kept:
            best = max(kept, key=lambda c: pairs.judge(c["ratios"]).gain)
            verdict = pairs.judge(best["ratios"])
            record["tuned"] = {
                "value": best["value"],
                "label": best["label"],
                "gain": verdict.gain,
                "spread": verdict.spread,
                "pairs": verdict.pairs,
            }
        return record


def with_live(base: knob_table.Live, own: knob_table.Live) -> knob_table.Live:
    """The kernel settings of one side: those kept before, with this knob's own over them."""
    return tuple(sorted({**dict(base), **dict(own)}.items()))


def run(
    runner: Any,
    spec: dict[str, Any],
    *,
    ledger: Ledger,
    clock: Callable[[], float] = time.monotonic,
    busy: Callable[[], float] | None = None,
    live: Live | None = None,
) -> dict[str, Any]:
    """Tune the workloads spec["workloads"] over spec["knobs"] (empty: every knob each responds to)
    within spec["budget_s"]; the result per workload: knobs, each with its rule, candidates and verdicts.
    LIVE: the kernel settings a kernel knob changes, put back when the run ends however it ends, and
    first what a run that never ended left (its journal)."""
    out: dict[str, Any] = {"budget_s": float(spec["budget_s"]), "workloads": {}}
    if live is not None:
        restored = live.recover()
        if restored:
            out["restored"] = restored
    try:
        return _run(runner, spec, ledger, clock, busy, live, out)
    finally:
        if live is not None:
            # Not cut short by the signal that ended the run arriving again (end_run_processes sends
            # SIGTERM to every process of an interrupted run).
            held = (signal.SIGINT, signal.SIGTERM, signal.SIGHUP)
            previous = signal.pthread_sigmask(signal.SIG_BLOCK, held)
            try:
                put_back = live.restore()
            finally:
                signal.pthread_sigmask(signal.SIG_SETMASK, previous)
            if put_back:
                out["put_back"] = put_back


def _run(
    runner: Any,
    spec: dict[str, Any],
    ledger: Ledger,
    clock: Callable[[], float],
    busy: Callable[[], float] | None,
    live: Live | None,
    out: dict[str, Any],
) -> dict[str, Any]:
    from ..smoke.workloads import BY_NAME

    search = _Search(runner, ledger, clock, float(spec["budget_s"]), spec, live)
    out["cores"] = search.cores
    if busy is not None and not spec.get("force"):
        share = busy()
        out["cpu_busy_before"] = share
        if share > BUSY_SHARE:
            out["refused"] = (
                f"{share:.0%} of the CPUs were busy before the run (over {BUSY_SHARE:.0%}): the figures would measure "
                "the other work; run tune on an idle host, or pass --force"
            )
            return out
    for name in spec["workloads"]:
        if search.stopped:
            break
        module = BY_NAME[name]
        objective = module.TUNE
        wanted = [k for k in knob_table.searchable(module.KNOBS) if not spec.get("knobs") or k in spec["knobs"]]
        entry: dict[str, Any] = {"unit": objective.unit, "higher_is_better": objective.higher_is_better, "knobs": {}}
        out["workloads"][name] = entry
        base: knob_table.Env = {}
        base_live: knob_table.Live = ()
        # What a workload prepares once per run, outside the timed pairs (the model server's model):
        # where it cannot, its knobs are not searched and say why.
        # Not for a run that stopped or has no time left, nor for knobs the plan lacks or a role variable outranks.
        prepare = getattr(module, "tune_prepare", None)
        overridden = runner.plan.get("overridden") or {}
        needed = (
            prepare is not None
            and any(runner.plan.get(k) is not None and k not in overridden for k in wanted)
            and not (search.stopped or HUNG_UP)
            and search.may_go_on(name)
        )
        ready = prepare(runner) if prepare is not None and needed else {}
        unready = ready.get("error") or ready.get("skipped")
        if unready:
            entry["knobs"] = {knob: {"skipped": unready} for knob in wanted}
            continue
        for knob in wanted:
            by = overridden.get(knob)
            if by:
                entry["knobs"][knob] = {
                    "skipped": f"{by[0]} is set for this host (its inventory, or an -e that up recorded) and ranks above "
                    f"plan_{knob}: a kept value would not be applied; remove it (from the inventory, or `up -e` it "
                    "no more) to let tune measure it"
                }
                continue
            rule = runner.plan.get(knob)
            if rule is None:
                entry["knobs"][knob] = {"skipped": f"the plan has no {knob}: run provisioner up first"}
                continue
            spec_of = knob_table.KNOBS[knob]
            if spec_of.rule_given is not None:
                # The plan's value once the values kept before it are applied (serving's workers follow its threads).
                rule = spec_of.rule_given(rule, base, runner.plan, search.cores)
            inert = _inert(knob, base_live, live)
            if inert:
                entry["knobs"][knob] = {"skipped": inert}
                continue
            record = search.knob(name, objective, knob, rule, base, base_live)
            entry["knobs"][knob] = record
            value = record["tuned"]["value"] if record.get("tuned") else rule
            if record.get("tuned"):
                base = {**base, **spec_of.env(value, search.cores)}
            if spec_of.sysfs and "skipped" not in record:
                # The knobs after a kernel knob run under its kept value, else the plan's: not under
                # the value from before the run (a kernel the plan was not applied to live), and a
                # study of theirs resumes only under the same value (it is in their key).
                base_live = with_live(base_live, spec_of.live(value))
    out["seconds"] = round(clock() - search.started, 2)
    if search.stopped:
        out["stopped"] = search.stopped
    return out


def _inert(knob: str, base_live: knob_table.Live, live: Live | None) -> str:
    """Why KNOB moves nothing under the settings it would be measured under, else "": THP's defrag
    policy with THP's mode never (the mode its search runs under: the one this run searched, else
    the kernel's now), where no huge page is ever faulted in."""
    if knob != "thp_defrag":
        return ""
    mode = dict(base_live).get(knob_table.THP_ENABLED)
    if mode is None and live is not None:
        try:
            mode = live.read(knob_table.THP_ENABLED)
        except OSError:
            mode = None
    if mode != "never":
        return ""
    return "THP's mode is never here: no huge page is faulted in, so the defrag policy moves nothing"


def locked(state_dir: str, work: Callable[[], dict[str, Any]]) -> dict[str, Any]:
    """WORK while holding the host's tune lock: a second tune at the same time is refused (its
    figures would measure the first), naming the process that holds it."""
    import fcntl

    os.makedirs(state_dir, mode=0o700, exist_ok=True)
    with open(os.path.join(state_dir, "lock"), "a+", encoding="utf-8") as f:
        try:
            fcntl.flock(f, fcntl.LOCK_EX | fcntl.LOCK_NB)
        except BlockingIOError:
            f.seek(0)
            holder = f.read().strip() or "another process"
            return {"refused": f"another tune is running on this host ({holder}): wait for it, or stop it"}
        f.seek(0)
        f.truncate()
        f.write(f"pid {os.getpid()}")
        f.flush()
        return work()

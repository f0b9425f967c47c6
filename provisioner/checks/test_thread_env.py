"""What the thread_env role promises, checked on the target: every way work starts gets the
plan's threads, pinning variables are never exported system-wide, ml-env splits the cores."""

from __future__ import annotations

import json
import shlex

import pytest

from provisioner.checks import applied_plan, as_root, role_vars, status_program
from provisioner.checks.test_cpu_tuning import declared_status, drifted

PROFILE = "/etc/profile.d/60-provisioner-threads.sh"
USER_ENV = "/etc/environment.d/60-provisioner-threads.conf"
MANAGER = "/etc/systemd/system.conf.d/60-provisioner-threads.conf"
ML_ENV = "/usr/local/bin/ml-env"
PAM_ENV = "/etc/security/pam_env.conf"
PAM_MARKER = "provisioner thread_env"
ENV_D_GENERATOR = "/usr/lib/systemd/user-environment-generators/30-systemd-environment-d-generator"
PINNING = ("OMP_PROC_BIND", "OMP_PLACES", "GOMP_CPU_AFFINITY")
CLEAN = "env -i PATH=/usr/local/sbin:/usr/local/bin:/usr/sbin:/usr/bin:/sbin:/bin"
# Counts that are not the thread count: variable -> the role option that holds it, and the plan
# value it follows (ml-env gives each trial the same share of them as of the cores).
SCALED = {
    "ARROW_IO_THREADS": ("thread_env_arrow_io_threads", "arrow_io_threads"),
    "TF_NUM_INTEROP_THREADS": ("thread_env_tf_inter_op_threads", "tf_inter_op_threads"),
    "PROVISIONER_TORCH_INTEROP_THREADS": ("thread_env_torch_interop_threads", "torch_interop_threads"),
    "PROVISIONER_DATALOADER_WORKERS": ("thread_env_dataloader_workers", "dataloader_workers"),
    "PROVISIONER_DATALOADER_THREADS": ("thread_env_dataloader_threads", "dataloader_threads"),
}
# Thread-count variables and the plan values of the same count.
SAME_AS_THREADS = {
    "TF_NUM_INTRAOP_THREADS": "tf_intra_op_threads",
    "OMP_NUM_THREADS": "arrow_cpu_threads",
}
# Thread variables with a count of their own: the thread count unless plan_polars_threads or
# plan_joblib_workers set another; then threads.conf has them with the scaled counts.
OWN_COUNTS = {
    "POLARS_MAX_THREADS": ("thread_env_polars_threads", "polars_threads"),
    "LOKY_MAX_CPU_COUNT": ("thread_env_joblib_workers", "joblib_workers"),
}


def own_counts(te: dict) -> dict[str, str]:
    """The variables of OWN_COUNTS the role exports with another count than the threads: name -> value."""
    threads = str(int(te["thread_env_threads"]))
    values = {name: str(int(te[option])) for name, (option, _) in OWN_COUNTS.items() if name in te["thread_env_variables"]}
    return {name: value for name, value in values.items() if value != threads}


@pytest.fixture()
def te(host):
    return role_vars(host, "thread_env")


@pytest.fixture()
def expected(te):
    """Variable -> value every way work starts must show."""
    threads = str(int(te["thread_env_threads"]))
    values = {name: threads for name in te["thread_env_variables"]}
    values.update(own_counts(te))
    values["PROVISIONER_THREADS"] = threads  # what the ML environment's hook splits among joblib's workers
    values.update({name: str(int(te[option])) for name, (option, _) in SCALED.items()})
    if te["thread_env_tf_onednn"]:
        values["TF_ENABLE_ONEDNN_OPTS"] = "1"
    if te["thread_env_openmp_runtime"] == "libiomp":
        values["KMP_BLOCKTIME"] = str(int(te["thread_env_kmp_blocktime"]))
        values["KMP_AFFINITY"] = te["thread_env_kmp_affinity"]
    return values


@pytest.fixture()
def ml_user(host):
    return role_vars(host, "common")["common_ml_user"]


def parse_env(text: str) -> dict[str, str]:
    return dict(line.split("=", 1) for line in text.splitlines() if "=" in line)


def state_dir(host) -> str:
    return role_vars(host, "common")["common_state_dir"]


def systemd_is_pid1(host) -> bool:
    return host.file("/proc/1/comm").content_string.strip() == "systemd" and host.file("/run/systemd/system").is_directory


def physical_cores(host) -> int:
    out = host.check_output("lscpu -p=CORE,SOCKET | grep -v '^#' | sort -u | wc -l")
    return int(out.strip())


def where_set(host, user: str, names: list[str]) -> dict[str, str]:
    """NAME -> where a login shell of USER gets its value and what repairs it: the status
    script's own source finder (bash's trace of the login shell), run on the target."""
    code = status_program(
        "import json\n"
        "from provisioner_status.probes import Probes\n"
        "from provisioner_status.sources import describe_source\n"
        "probes = Probes()\n"
        f"found = {{n: probes.source({{'probe': 'login_env', 'user': {user!r}, 'var': n}}, None) for n in {names!r}}}\n"
        "print(json.dumps({n: describe_source(s, n) if s else None for n, s in found.items()}))\n"
    )
    with as_root(host):
        r = host.run("python3 -c %s", code)
    if r.rc != 0:
        return {n: f"where it is set is unknown: {r.stderr.strip()[-200:]}" for n in names}
    told = json.loads(r.stdout)
    return {n: told.get(n) or "no file the login shell reads sets it: it came with the session's environment" for n in names}


def login_drift(host, user: str, env: dict[str, str], expected: dict[str, str]) -> str:
    """Each variable of a login shell of USER that is not the expected value, with the file and
    line that set it and what repairs it ("" when every one holds)."""
    wrong = sorted(k for k in expected if env.get(k) != expected[k])
    if not wrong:
        return ""
    told = where_set(host, user, wrong)
    return "; ".join(f"{k}={env.get(k, '(unset)')} in a login shell of {user}, expected {expected[k]}: {told[k]}" for k in wrong)


def test_threads_follow_the_plan(host, te):
    plan = applied_plan(host)
    assert plan, "no /etc/provisioner/plan.json: run provisioner up"
    assert int(te["thread_env_threads"]) >= 1
    try:
        inventory = host.ansible.get_variables()
    except Exception:  # not an ansible:// host
        inventory = {}
    if "thread_env_threads" not in inventory:
        assert int(te["thread_env_threads"]) == plan["values"]["threads_per_job"]
        # The other runtimes' pools of one job are the same count in the plan.
        for name, key in SAME_AS_THREADS.items():
            if name in te["thread_env_variables"]:
                assert plan["values"][key] == int(te["thread_env_threads"]), key
    for option, key in [*SCALED.values(), *OWN_COUNTS.values()]:
        if option not in inventory and "thread_env_threads" not in inventory:
            assert int(te[option]) == plan["values"][key], option


def test_settings_file_for_ml_env(host, te):
    config = role_vars(host, "common")["common_config_dir"]
    f = host.file(f"{config}/threads.conf")
    assert f.exists and f.user == "root" and f.mode == 0o644
    settings = {k: v.strip('"') for k, v in parse_env(f.content_string).items()}
    assert settings["cores"] == str(int(te["thread_env_threads"]))
    assert settings["trials"] == str(int(te["thread_env_trials"]))
    own = own_counts(te)
    assert settings["variables"].split() == [name for name in te["thread_env_variables"] if name not in own]
    scaled = dict(item.split("=", 1) for item in settings["scaled"].split())
    assert scaled == {**{name: str(int(te[option])) for name, (option, _) in SCALED.items()}, **own}
    assert settings["fixed"].split() == (["TF_ENABLE_ONEDNN_OPTS=1"] if te["thread_env_tf_onednn"] else [])


def test_login_shell_gets_the_threads(host, expected):
    env = parse_env(host.check_output(f"{CLEAN} HOME=/root bash -lc env"))
    assert {k: env.get(k) for k in expected} == expected, login_drift(host, "root", env, expected)


def test_login_shell_of_the_ml_user_gets_the_threads(host, expected, ml_user):
    with as_root(host):
        env = parse_env(host.check_output(f"{CLEAN} runuser -l {ml_user} -c env"))
    assert {k: env.get(k) for k in expected} == expected, login_drift(host, ml_user, env, expected)


def test_login_shell_keeps_a_value_the_user_exported(host):
    out = host.check_output(f"{CLEAN} HOME=/root OMP_NUM_THREADS=3 bash -lc 'echo $OMP_NUM_THREADS'")
    assert out.strip() == "3", f"OMP_NUM_THREADS={out.strip()}: {where_set(host, 'root', ['OMP_NUM_THREADS'])['OMP_NUM_THREADS']}"


def test_pam_sessions_get_the_threads(host, te, expected, ml_user):
    """ssh commands, su and cron start without a login shell: pam_env gives them the threads."""
    if not te["thread_env_pam_env"]:
        assert pam_block(host) == ""
        return
    with as_root(host):
        # su runs the PAM session stack; sh -c reads no profile, so the values come from pam_env.
        env = parse_env(host.check_output(f"{CLEAN} su -s /bin/sh {ml_user} -c env"))
    assert {k: env.get(k) for k in expected} == expected


def test_user_sessions_get_the_threads(host, expected, ml_user):
    f = host.file(USER_ENV)
    assert f.exists and f.user == "root" and f.mode == 0o644
    if host.file(ENV_D_GENERATOR).exists:
        # What systemd --user computes from environment.d for the ML user's sessions.
        with as_root(host):
            env = parse_env(host.check_output(f"{CLEAN} runuser -u {ml_user} -- {ENV_D_GENERATOR}"))
        assert {k: env.get(k) for k in expected} == expected


def test_manager_drop_in_sets_default_environment(host, expected):
    f = host.file(MANAGER)
    assert f.exists and f.user == "root" and f.mode == 0o644
    lines = [line for line in f.content_string.splitlines() if line.startswith("DefaultEnvironment=")]
    assert len(lines) == 1
    assigned = dict(item.split("=", 1) for item in shlex.split(lines[0][len("DefaultEnvironment=") :]))
    assert assigned == expected


def test_services_get_the_threads(host, expected):
    """A service started now (after the role re-executed the manager) has the variables."""
    if not systemd_is_pid1(host):
        pytest.skip("systemd is not PID 1 here: services get the drop-in at the next boot")
    with as_root(host):
        manager = parse_env(host.check_output("systemctl show-environment"))
        service = parse_env(host.check_output("systemd-run --quiet --wait --pipe --collect /usr/bin/env"))
    # The status script names the manager's drop-in (or run-time value) behind a wrong one.
    assert {k: manager.get(k) for k in expected} == expected, service_drift(host)
    assert {k: service.get(k) for k in expected} == expected, service_drift(host)
    assert not set(PINNING) & set(service), "a service got a pinning variable"


def service_drift(host) -> str:
    return "; ".join(
        f"{s['name']}: {s['live']}, expected {s['expected']}" + (f": {s['repair']}" if s.get("repair") else "")
        for s in declared_status(host, "thread_env")
        if s["state"] == "drifted" and s["probe"] == "service_env"
    )


def settings(text: str) -> str:
    """The lines of a configuration file that set something (comments left out)."""
    return "\n".join(line for line in text.splitlines() if line.strip() and not line.lstrip().startswith("#"))


def test_pinning_variables_never_exported_system_wide(host):
    for path in (PROFILE, USER_ENV, MANAGER, "/etc/environment"):
        f = host.file(path)
        if f.exists:
            found = [name for name in PINNING if name in settings(f.content_string)]
            assert found == [], f"{path} sets {found}"
    assert not [name for name in PINNING if name in pam_block(host)]
    env = parse_env(host.check_output(f"{CLEAN} HOME=/root bash -lc env"))
    assert not set(PINNING) & set(env)


def test_kmp_variables_only_for_intel_openmp(host, te):
    text = settings(host.file(PROFILE).content_string + host.file(MANAGER).content_string) + pam_block(host)
    if te["thread_env_openmp_runtime"] == "libiomp":
        assert "KMP_BLOCKTIME" in text and "KMP_AFFINITY" in text
    else:
        assert "KMP_" not in text, "KMP_* exported though the OpenMP runtime is not libiomp"


def pam_block(host) -> str:
    f = host.file(PAM_ENV)
    if not f.exists:
        return ""
    text = f.content_string
    begin, end = f"# BEGIN {PAM_MARKER}", f"# END {PAM_MARKER}"
    if begin not in text:
        return ""
    return settings(text.split(begin, 1)[1].split(end, 1)[0])


def kernel_records(host) -> dict[str, dict]:
    """The kernelspec records of originals/thread_env.json and of later kernelspecs."""
    base = f"{state_dir(host)}/originals"
    with as_root(host):
        main = host.file(f"{base}/thread_env.json")
        records = json.loads(main.content_string).get("kernels", {}) if main.exists else {}
        extra = host.run(f"cat {base}/thread_env.kernels/*.json 2>/dev/null")
    decoder = json.JSONDecoder()
    text, pos = extra.stdout, 0
    while text[pos:].strip():
        pos += len(text[pos:]) - len(text[pos:].lstrip())
        obj, pos = decoder.raw_decode(text, pos)
        records.update(obj)
    return records


def test_jupyter_kernelspecs_get_the_threads(host, te, expected):
    dirs = " ".join(shlex.quote(d) for d in te["thread_env_jupyter_kernel_dirs"])
    found = host.run(f"find {dirs} -mindepth 2 -maxdepth 2 -name kernel.json -type f 2>/dev/null").stdout.split()
    if not found:
        pytest.skip("no Jupyter kernelspec on this host")
    records = kernel_records(host)
    for path in found:
        spec = json.loads(host.file(path).content_string)
        env = spec.get("env", {})
        assert path in records, f"{path}: no record of its original values for undo"
        original = records[path]["env"]
        own = any(original.get(name) is not None for name in expected)
        if own and not te["thread_env_jupyter_override"]:
            # The kernelspec chose its own threads before provisioner: left as it was.
            assert {k: env.get(k) for k in expected} == {k: original.get(k) for k in expected}, path
        else:
            assert {k: env.get(k) for k in expected} == expected, path
        assert not set(PINNING) & set(env)


def test_originals_recorded_before_the_first_change(host):
    with as_root(host):
        f = host.file(f"{state_dir(host)}/originals/thread_env.json")
        assert f.exists and f.user == "root" and f.mode == 0o600
        data = json.loads(f.content_string)
    assert {PROFILE, USER_ENV, MANAGER, ML_ENV} <= set(data["created"])
    assert isinstance(data["kernels"], dict)


def test_ml_env_runs_parallel_trials_with_their_share(host, te):
    f = host.file(ML_ENV)
    assert f.exists and f.user == "root" and f.mode == 0o755
    cores = min(int(te["thread_env_threads"]), physical_cores(host))
    per_trial = max(1, cores // 2)
    out = host.check_output(f"{CLEAN} {ML_ENV} --trials 2 -- sh -c 'echo $ML_ENV_TRIAL $OMP_NUM_THREADS'")
    assert sorted(out.splitlines()) == [f"0 {per_trial}", f"1 {per_trial}"]
    one = host.check_output(f"{CLEAN} {ML_ENV} -- sh -c 'echo $ML_ENV_TRIALS $OMP_NUM_THREADS $OMP_PROC_BIND'")
    assert one.split() == ["1", str(cores)]


def test_ml_env_gives_each_trial_its_share_of_every_count(host, te):
    """Two trials: each gets half the cores, and half (at least 1; DataLoader workers at least 0)
    of Arrow's IO pool, the inter-op pools, the DataLoader split, Polars' pool and joblib's workers."""
    cores = min(int(te["thread_env_threads"]), physical_cores(host))
    per_trial = max(1, cores // 2)
    names = [*SCALED, "POLARS_MAX_THREADS", "LOKY_MAX_CPU_COUNT", "TF_ENABLE_ONEDNN_OPTS"]
    echo = " ".join(f"${name}" for name in names)
    out = host.check_output(f"{CLEAN} {ML_ENV} --trials 2 -- sh -c 'echo $ML_ENV_TRIAL {echo}'")
    base = int(te["thread_env_threads"])
    share = {
        name: str(max(0 if name == "PROVISIONER_DATALOADER_WORKERS" else 1, int(te[option]) * per_trial // base))
        for name, (option, _) in SCALED.items()
    }
    own = [str(max(1, int(te[option]) * per_trial // base)) for option, _ in OWN_COUNTS.values()]
    onednn = "1" if te["thread_env_tf_onednn"] else ""
    row = " ".join([*(share[n] for n in SCALED), *own, onednn]).strip()
    assert sorted(out.splitlines()) == [f"0 {row}", f"1 {row}"]
    workers, threads = int(share["PROVISIONER_DATALOADER_WORKERS"]), int(share["PROVISIONER_DATALOADER_THREADS"])
    assert workers + threads <= per_trial or te["thread_env_allow_oversubscription"]


def test_ml_env_refuses_oversubscription(host, te):
    trials = int(te["thread_env_threads"]) + 1
    r = host.run(f"{CLEAN} {ML_ENV} --trials {trials} -- true")
    assert r.rc == 2
    assert len(r.stderr.strip().splitlines()) == 1 and "--oversubscribe" in r.stderr


def test_ml_env_pins_trials_to_disjoint_cores(host):
    if physical_cores(host) < 2:
        pytest.skip("one physical core: nothing to pin apart")
    out = host.check_output(
        f"{CLEAN} {ML_ENV} --trials 2 --pin -- sh -c "
        "'echo $ML_ENV_TRIAL $OMP_PROC_BIND $OMP_PLACES $(grep Cpus_allowed_list: /proc/self/status)'"
    )
    rows = sorted(line.split() for line in out.splitlines())
    assert [r[:3] for r in rows] == [["0", "close", "cores"], ["1", "close", "cores"]]
    assert rows[0][4] != rows[1][4], f"pinned trials share CPUs: {rows}"


def test_status_finds_no_drift(host, expected, ml_user):
    settings = declared_status(host, "thread_env")
    assert {s["name"] for s in settings} == {f"{v} in a login shell of {ml_user}" for v in expected} | {
        f"{v} in a service" for v in expected
    }
    # A value a file of someone else's sets: the file, the line, and that `provisioner up` cannot repair it.
    assert drifted(settings) == [], "; ".join(f"{s['name']}: {s['repair']}" for s in settings if s.get("repair"))
    if systemd_is_pid1(host):
        assert {s["state"] for s in settings} == {"ok"}

"""What the cpu_tuning role promises, checked on the target.

Persisted configuration (tuned profile, sysctl.d, tmpfiles.d) is checked everywhere; live
kernel values only where this host may write them (in a container vm.*, THP and cpufreq belong
to the host's kernel and are read-only, so those checks skip and say which knob).
"""

from __future__ import annotations

import json

import pytest

from provisioner import checks
from provisioner.checks import STATUS, applied_plan, as_root, role_vars, status_program

PROFILE_DIR = "/etc/tuned/provisioner-ml"
SYSCTL_FILE = "/etc/sysctl.d/60-provisioner-cpu.conf"
TMPFILES_FILE = "/etc/tmpfiles.d/provisioner-cpu.conf"
STATE_DIR = "/var/lib/provisioner"
THP = "/sys/kernel/mm/transparent_hugepage"
CPUFREQ = "/sys/devices/system/cpu/cpufreq"


def _none(value):
    """Plan values rendered to text come back as 'None' for null."""
    return None if value in (None, "None", "none", "") else value


def _probed(host):
    """What the role's own defaults fall back to without a plan, read from the host as the role's
    probe reads it (one command): a cpufreq driver, EPP, a boost control, the NUMA nodes."""
    out = host.check_output(
        "[ -d /sys/devices/system/cpu/cpu0/cpufreq ] && echo cpufreq; "
        f"ls {CPUFREQ}/policy*/energy_performance_preference >/dev/null 2>&1 && echo epp; "
        f"for f in {CPUFREQ}/boost /sys/devices/system/cpu/intel_pstate/no_turbo; do [ -f $f ] && echo boost=$f && break; done; "
        "echo nodes=$(ls -d /sys/devices/system/node/node[0-9]* 2>/dev/null | wc -l)"
    ).split()
    found = dict(line.partition("=")[::2] for line in out)
    return {
        "_cpu_tuning_has_cpufreq": "cpufreq" in found,
        "_cpu_tuning_has_epp": "epp" in found,
        "_cpu_tuning_boost_file": found.get("boost", ""),
        "_cpu_tuning_numa_nodes": int(found.get("nodes") or 0),
    }


@pytest.fixture(scope="module")
def cpu(host):
    """The role's options as the host got them (once a host). A run of the role without role
    common (`up --tags cpu_tuning`) records no plan: its defaults then used what the role probed
    on the host, and so do the checks (else they would expect a governor without cpufreq)."""
    if applied_plan(host):
        return {k: _none(v) for k, v in role_vars(host, "cpu_tuning").items()}
    given = dict(checks.EXTRA_VARS)
    checks.EXTRA_VARS.update({**_probed(host), **given})
    try:
        values = role_vars(host, "cpu_tuning")
    finally:
        checks.EXTRA_VARS.clear()
        checks.EXTRA_VARS.update(given)
    return {k: _none(v) for k, v in values.items()}


@pytest.fixture(scope="module")
def state_dir(host):
    return role_vars(host, "common").get("common_state_dir") or STATE_DIR


def _lines(host, path):
    with as_root(host):
        f = host.file(path)
        assert f.exists, f"{path} missing: run provisioner up"
        return [line.strip() for line in f.content_string.splitlines() if line.strip() and not line.startswith("#")]


def _writable(host, path):
    with as_root(host):
        return host.run(f"test -w {path}").rc == 0


def _read(host, path):
    with as_root(host):
        return host.file(path).content_string.strip()


def _systemd_pid1(host):
    return host.file("/proc/1/comm").content_string.strip() == "systemd"


def _thp_mode(text):
    return text.split("[", 1)[1].split("]", 1)[0] if "[" in text else text


def test_packages_installed(host, cpu):
    missing = [p for p in cpu["cpu_tuning_packages"] if not host.package(p).is_installed]
    assert missing == [], f"packages not installed: {missing}"


def test_tuned_profile_file(host, cpu):
    lines = _lines(host, f"{PROFILE_DIR}/tuned.conf")
    assert f"include={cpu['cpu_tuning_tuned_profile']}" in lines
    assert f"transparent_hugepages={cpu['cpu_tuning_thp_enabled']}" in lines
    assert f"transparent_hugepage.defrag={cpu['cpu_tuning_thp_defrag']}" in lines
    assert f"vm.swappiness={cpu['cpu_tuning_swappiness']}" in lines
    numa = [line for line in lines if line.startswith("kernel.numa_balancing")]
    if cpu["cpu_tuning_numa_balancing"] is None:
        assert numa == [], "the plan gives no numa_balancing; the profile must leave it alone"
    else:
        assert numa == [f"kernel.numa_balancing={cpu['cpu_tuning_numa_balancing']}"]
    for key, option in (
        ("governor", "cpu_tuning_governor"),
        ("energy_performance_preference", "cpu_tuning_energy_performance_preference"),
    ):
        if cpu[option] is not None:
            assert f"{key}={cpu[option]}" in lines


def test_sysctl_file(host, cpu):
    lines = _lines(host, SYSCTL_FILE)
    expected = [f"vm.swappiness = {cpu['cpu_tuning_swappiness']}"]
    if cpu["cpu_tuning_numa_balancing"] is not None:
        expected.append(f"kernel.numa_balancing = {cpu['cpu_tuning_numa_balancing']}")
    assert lines == expected


def test_tmpfiles_thp(host, cpu):
    lines = _lines(host, TMPFILES_FILE)
    assert f"w- {THP}/enabled - - - - {cpu['cpu_tuning_thp_enabled']}" in lines
    assert f"w- {THP}/defrag - - - - {cpu['cpu_tuning_thp_defrag']}" in lines


def test_tuned_profile_active(host):
    if not _systemd_pid1(host):
        pytest.skip("PID 1 is not systemd here: tuned is not driven, the profile stays installed for later")
    assert host.service("tuned").is_running
    assert host.service("tuned").is_enabled
    with as_root(host):
        out = host.check_output("tuned-adm active")
    assert "Current active profile: provisioner-ml" in out


@pytest.mark.parametrize(
    ("knob", "path"),
    [
        ("vm.swappiness", "/proc/sys/vm/swappiness"),
        ("kernel.numa_balancing", "/proc/sys/kernel/numa_balancing"),
        ("THP enabled", f"{THP}/enabled"),
        ("THP defrag", f"{THP}/defrag"),
    ],
)
def test_live_value(host, cpu, knob, path):
    option = {
        "vm.swappiness": "cpu_tuning_swappiness",
        "kernel.numa_balancing": "cpu_tuning_numa_balancing",
        "THP enabled": "cpu_tuning_thp_enabled",
        "THP defrag": "cpu_tuning_thp_defrag",
    }[knob]
    if cpu[option] is None:
        pytest.skip(f"{option} is null: {knob} is left alone")
    if not host.file(path).exists:
        pytest.skip(f"{path} does not exist on this kernel")
    if str(cpu["cpu_tuning_apply_live"]).lower() == "false":
        pytest.skip("cpu_tuning_apply_live is false: only the persisted configuration applies")
    if not _writable(host, path):
        pytest.skip(
            f"{knob} ({path}) is read-only here (a container: the host's kernel owns it); persisted config checked instead"
        )
    live = _read(host, path)
    if path.startswith(THP):
        live = _thp_mode(live)
    assert live == str(cpu[option]), f"{knob} is {live}, the plan wants {cpu[option]}"


def test_governor(host, cpu, state_dir):
    state = _lines(host, f"{state_dir}/cpu_tuning.state")
    governor = [line for line in state if line.startswith("governor: ")]
    if not host.file("/sys/devices/system/cpu/cpu0/cpufreq").exists:
        assert governor == ["governor: not applicable: no cpufreq driver"]
        plan_values = applied_plan(host).get("values", {})
        assert plan_values.get("cpu_governor", None) is None, "the plan sets a governor on a host without cpufreq"
        # Nothing live to read: a virtual machine (or a container on one) without a cpufreq
        # driver has no governor and no energy-performance preference at all.
        pytest.skip(
            "no cpufreq driver on this host (no /sys/devices/system/cpu/cpu0/cpufreq): "
            "no governor or energy-performance preference exists to set; recorded as not applicable"
        )
    assert governor, "the state file has no governor line"
    wanted = cpu["cpu_tuning_governor"]
    if wanted is None or governor[0].startswith("governor: not applicable"):
        pytest.skip(governor[0])
    policies = sorted(p for p in host.run(f"ls -d {CPUFREQ}/policy*").stdout.split())
    if str(cpu["cpu_tuning_apply_live"]).lower() == "false":
        pytest.skip("cpu_tuning_apply_live is false: only the persisted configuration applies")
    if not _writable(host, f"{policies[0]}/scaling_governor"):
        pytest.skip("scaling_governor is read-only here (a container: the host's kernel owns cpufreq)")
    wrong = {p: _read(host, f"{p}/scaling_governor") for p in policies}
    wrong = {p: g for p, g in wrong.items() if g != wanted}
    assert wrong == {}, f"governor is not {wanted} on {wrong}"
    epp = cpu["cpu_tuning_energy_performance_preference"]
    if epp is not None:
        values = {
            p: _read(host, f"{p}/energy_performance_preference")
            for p in policies
            if host.file(f"{p}/energy_performance_preference").exists
        }
        assert {p: v for p, v in values.items() if v != epp} == {}


def test_state_file_explains(host, state_dir):
    state = _lines(host, f"{state_dir}/cpu_tuning.state")
    keys = [line.split(":", 1)[0] for line in state]
    assert keys[:4] == ["governor", "tuned", "live", "persisted"]


def test_originals_recorded(host, state_dir):
    path = f"{state_dir}/originals/cpu_tuning.json"
    with as_root(host):
        f = host.file(path)
        assert f.exists, f"{path} missing: undo could not restore the originals"
        assert f.user == "root" and f.mode == 0o600
        data = json.loads(f.content_string)
    assert "/proc/sys/vm/swappiness" in data["live"]
    assert "tuned_profile" in data
    assert SYSCTL_FILE in data["created"] and PROFILE_DIR in data["created"]


def declared_status(host, role: str) -> list[dict]:
    """ROLE's settings as the status script sees them on the target, from what ROLE declared."""
    expected = f"{role_vars(host, 'common')['common_config_dir']}/expected"
    f = host.file(f"{expected}/{role}.json")
    assert f.exists and f.user == "root" and f.mode == 0o644, f"{role} declared no expected state in {expected}"
    key = (host.backend.get_pytest_id() if hasattr(host, "backend") else str(id(host)), expected)
    if key not in STATUS:
        with as_root(host):
            program = status_program("from provisioner_status.cli import main\nrc = main(sys.argv[1:])\n") + "sys.exit(rc)\n"
            r = host.run("python3 -c %s --expected-dir %s --json", program, expected)
        assert r.rc in (0, 1) and r.stdout.strip(), f"the status script exited {r.rc}: {r.stderr.strip()[-500:]}"
        STATUS[key] = json.loads(r.stdout)["settings"]
    return [s for s in STATUS[key] if s["role"] == role]


def drifted(settings: list[dict]) -> list[str]:
    return [
        f"{s['name']}: expected {s['expected']}, live {s['live']} ({s['reason']})" for s in settings if s["state"] == "drifted"
    ]


def test_status_finds_no_drift(host, cpu):
    settings = declared_status(host, "cpu_tuning")
    names = {s["name"] for s in settings}
    assert {"swappiness", "THP enabled", "THP defrag", "tuned profile"} <= names, names
    assert ("CPU governor" in names) == (cpu["cpu_tuning_governor"] is not None)
    assert drifted(settings) == []

"""The drift check shipped to the hosts (roles/shared/files/provisioner_status, one zipapp): its
pure parts, the probes against a fake root, the exit code and the node_exporter textfile."""

from __future__ import annotations

import json
import os
import shutil
import subprocess
import tempfile
from pathlib import Path

import pytest
import sysfs_cases
from status_modules import cli, common, kernel, report, sources
from status_modules import probes as probing


def write(root: Path, path: str, text: str) -> Path:
    p = root / path.lstrip("/")
    p.parent.mkdir(parents=True, exist_ok=True)
    p.write_text(text)
    return p


# ---------------------------------------------------------------- sysctl.d as systemd-sysctl reads it


def test_sysctl_files_in_file_name_order_etc_hides_usr_lib_and_sysctl_conf_last(tmp_path):
    write(tmp_path, "/usr/lib/sysctl.d/50-pid-max.conf", "kernel.pid_max = 4194304\n")
    write(tmp_path, "/usr/lib/sysctl.d/60-provisioner-cpu.conf", "vm.swappiness = 1\n")  # hidden by /etc's
    write(tmp_path, "/etc/sysctl.d/60-provisioner-cpu.conf", "vm.swappiness = 10\n")
    write(tmp_path, "/run/sysctl.d/55-run.conf", "vm.swappiness = 30\n")
    write(tmp_path, "/etc/sysctl.d/README", "vm.swappiness = 99\n")  # not a .conf file
    write(tmp_path, "/etc/sysctl.conf", "#vm.swappiness = 80\n")
    files = [os.path.relpath(f, tmp_path) for f in kernel.sysctl_files(str(tmp_path))]
    assert files == ["usr/lib/sysctl.d/50-pid-max.conf", "run/sysctl.d/55-run.conf",
                     "etc/sysctl.d/60-provisioner-cpu.conf", "etc/sysctl.conf"]
    value, source = kernel.persisted_sysctl("vm.swappiness", kernel.sysctl_files(str(tmp_path)))
    assert (value, os.path.relpath(source, tmp_path)) == ("10", "etc/sysctl.d/60-provisioner-cpu.conf")


def test_a_later_file_overrides_and_a_dev_null_link_masks(tmp_path):
    write(tmp_path, "/etc/sysctl.d/60-provisioner-cpu.conf", "vm.swappiness = 10\n")
    write(tmp_path, "/etc/sysctl.d/99-local.conf", "; a comment\n-vm/swappiness=60\n")
    write(tmp_path, "/usr/lib/sysctl.d/50-default.conf", "kernel.numa_balancing = 1\n")
    (tmp_path / "etc/sysctl.d/50-default.conf").symlink_to("/dev/null")
    files = kernel.sysctl_files(str(tmp_path))
    assert kernel.persisted_sysctl("vm.swappiness", files)[0] == "60"
    assert kernel.persisted_sysctl("kernel.numa_balancing", files) == (None, None)


def test_sysctl_conf_linked_into_sysctl_d_is_read_once_in_its_place(tmp_path):
    write(tmp_path, "/etc/sysctl.conf", "vm.swappiness = 60\n")
    (tmp_path / "etc/sysctl.d").mkdir(parents=True)
    (tmp_path / "etc/sysctl.d/99-sysctl.conf").symlink_to("../sysctl.conf")
    write(tmp_path, "/etc/sysctl.d/99-zz-provisioner.conf", "vm.swappiness = 10\n")
    files = kernel.sysctl_files(str(tmp_path))
    assert [os.path.basename(f) for f in files] == ["99-sysctl.conf", "99-zz-provisioner.conf"]
    assert kernel.persisted_sysctl("vm.swappiness", files)[0] == "10"


def test_sysctl_values_compare_word_by_word():
    assert kernel.parse_sysctl("net.ipv4.tcp_rmem =\t4096  131072 6291456\n# x = 1\n") == [
        ("net.ipv4.tcp_rmem", "4096 131072 6291456")]


def test_sysctl_probe_reads_the_live_value_only_where_the_role_applied_it(tmp_path):
    write(tmp_path, "/proc/sys/vm/swappiness", "60\n")
    write(tmp_path, "/etc/sysctl.d/60-provisioner-cpu.conf", "vm.swappiness = 10\n")
    probes = probing.Probes(str(tmp_path))
    check = {"name": "swappiness", "probe": "sysctl", "key": "vm.swappiness", "expected": "10"}
    assert probes.measure({**check, "live": False}) == ("10", "ok", "")
    live, state, reason = probes.measure({**check, "live": True})
    assert state == "drifted" and "live 60" in live and "at boot 10" in live and "running kernel has 60" in reason


def test_sysctl_probe_names_the_file_that_overrides_at_boot(tmp_path):
    write(tmp_path, "/etc/sysctl.d/60-provisioner-cpu.conf", "vm.swappiness = 10\n")
    write(tmp_path, "/etc/sysctl.d/99-local.conf", "vm.swappiness = 60\n")
    live, state, reason = probing.Probes(str(tmp_path)).measure(
        {"name": "swappiness", "probe": "sysctl", "key": "vm.swappiness", "expected": "10"})
    assert state == "drifted" and "99-local.conf" in reason and "at boot 60" in live


# ---------------------------------------------------------------- THP


@pytest.mark.parametrize(("text", "word"), sysfs_cases.BRACKETED)
def test_thp_selected_word(text, word):
    assert kernel.thp_selected(text) == word


def test_thp_probe_live_and_persisted(tmp_path):
    thp = "/sys/kernel/mm/transparent_hugepage/enabled"
    write(tmp_path, thp, "[always] madvise never\n")
    write(tmp_path, "/etc/tmpfiles.d/provisioner-cpu.conf",
          f"# comment\nw- {thp} - - - - never\nw- {thp} - - - - madvise\n")
    probes = probing.Probes(str(tmp_path))
    check = {"name": "THP enabled", "probe": "thp", "path": thp, "expected": "madvise"}
    assert probes.measure({**check, "live": True})[:2] == ("always", "drifted")
    persisted = {**check, "live": False, "persisted_file": "/etc/tmpfiles.d/provisioner-cpu.conf"}
    assert probes.measure(persisted) == ("madvise", "ok", "")
    (tmp_path / "etc/tmpfiles.d/provisioner-cpu.conf").unlink()
    assert probes.measure(persisted)[1] == "drifted"


# ---------------------------------------------------------------- md arrays

MDSTAT_OK = """Personalities : [raid1] [raid0]
md127 : active raid1 loop4[1] loop3[0]
      1046528 blocks super 1.2 [2/2] [UU]

unused devices: <none>
"""

MDSTAT_FAILED = """Personalities : [raid1]
md127 : active raid1 loop4[1](F) loop3[0]
      1046528 blocks super 1.2 [2/1] [U_]

unused devices: <none>
"""

MDSTAT_REMOVED = """Personalities : [raid10]
md127 : active (auto-read-only) raid10 nvme0n1[0] nvme2n1[2] nvme3n1[3]
      2093056 blocks super 1.2 512K chunks 2 near-copies [4/3] [U_UU]
      bitmap: 0/1 pages [0KB], 65536KB chunk

md0 : inactive sdb[0](S)
      1046528 blocks super 1.2

unused devices: <none>
"""


def test_mdstat_parsing():
    arrays = kernel.parse_mdstat(MDSTAT_OK)
    assert arrays["md127"] == {"active": True, "state": "active", "level": "raid1", "members": ["loop4", "loop3"],
                               "failed": [], "slots": "[2/2]", "up": "UU", "degraded": False}
    failed = kernel.parse_mdstat(MDSTAT_FAILED)["md127"]
    assert failed["degraded"] and failed["failed"] == ["loop4"]
    arrays = kernel.parse_mdstat(MDSTAT_REMOVED)
    assert arrays["md127"]["level"] == "raid10" and arrays["md127"]["degraded"] and arrays["md127"]["up"] == "U_UU"
    assert not arrays["md0"]["active"] and arrays["md0"]["level"] is None


def md_root(tmp_path: Path, mdstat: str) -> probing.Probes:
    write(tmp_path, "/proc/mdstat", mdstat)
    write(tmp_path, "/dev/md127", "")
    (tmp_path / "dev/md").mkdir()
    (tmp_path / "dev/md/data").symlink_to("../md127")
    return probing.Probes(str(tmp_path))


def test_md_probe_ok_and_degraded_names_the_missing_member(tmp_path):
    check = {"name": "data array", "probe": "md", "device": "/dev/md/data", "expected": "active, not degraded",
             "members": ["loop3", "loop4"]}
    assert md_root(tmp_path / "ok", MDSTAT_OK).measure(check) == ("md127 active raid1 [2/2] [UU]", "ok", "")
    live, state, reason = md_root(tmp_path / "failed", MDSTAT_FAILED).measure(check)
    assert state == "drifted" and "degraded" in live and reason == "/dev/md/data is degraded: loop4 failed"
    removed = {**check, "members": ["nvme0n1", "nvme1n1", "nvme2n1", "nvme3n1"]}
    assert md_root(tmp_path / "removed", MDSTAT_REMOVED).measure(removed)[2] == "/dev/md/data is degraded: nvme1n1 missing"


def test_md_probe_without_the_driver_or_the_array(tmp_path):
    check = {"name": "data array", "probe": "md", "device": "/dev/md/data", "expected": "active, not degraded"}
    assert probing.Probes(str(tmp_path)).measure(check) == (None, "not applicable", "not applicable: no md driver")
    write(tmp_path, "/proc/mdstat", "Personalities :\nunused devices: <none>\n")
    assert probing.Probes(str(tmp_path)).measure(check)[1:] == ("drifted", "no /dev/md/data: the array is not assembled")


# ---------------------------------------------------------------- mounts, hugepages, cpufreq, tuned

MOUNTINFO = """22 27 0:21 / /proc rw,relatime - proc proc rw
27 1 254:0 / / rw,relatime - ext4 /dev/vda rw
90 27 9:127 / /data rw,noatime - xfs /dev/md127 rw,attr2
91 27 0:50 / /my\\040data rw - tmpfs tmpfs rw
"""


def test_mount_probe(tmp_path):
    write(tmp_path, "/proc/self/mountinfo", MOUNTINFO)
    probes = probing.Probes(str(tmp_path))
    assert probes.measure({"name": "m", "probe": "mount", "path": "/data", "fstype": "xfs", "expected": "xfs"}) == (
        "xfs (/dev/md127)", "ok", "")
    assert probes.measure({"name": "m", "probe": "mount", "path": "/data/", "fstype": "btrfs", "expected": "btrfs"})[1:] \
        == ("drifted", "/data is xfs, not btrfs")
    assert probes.measure({"name": "m", "probe": "mount", "path": "/scratch", "expected": "xfs"})[:2] == (
        "not mounted", "drifted")
    assert kernel.parse_mountinfo(MOUNTINFO)[-1]["mountpoint"] == "/my data"


def test_mount_uuid_wrong_is_drift_and_unreadable_is_no_evidence(tmp_path, monkeypatch):
    write(tmp_path, "/proc/self/mountinfo", MOUNTINFO)
    probes = probing.Probes(str(tmp_path))
    check = {"name": "m", "probe": "mount", "path": "/data", "fstype": "xfs", "uuid": "u-1", "expected": "xfs"}
    monkeypatch.setattr(probing, "device_uuid", lambda source: "u-2")
    assert probes.measure(check)[1:] == ("drifted", "/data has UUID u-2, not u-1")
    monkeypatch.setattr(probing, "device_uuid", lambda source: "u-1")
    assert probes.measure(check) == ("xfs UUID=u-1 (/dev/md127)", "ok", "")
    monkeypatch.setattr(probing, "device_uuid", lambda source: None)
    _live, state, reason = probes.measure(check)
    assert state == "ok" and "cannot be read here" in reason


def test_hugepages_probe(tmp_path):
    write(tmp_path, "/sys/kernel/mm/hugepages/hugepages-2048kB/nr_hugepages", "512\n")
    write(tmp_path, "/sys/kernel/mm/hugepages/hugepages-1048576kB/nr_hugepages", "0\n")
    write(tmp_path, "/proc/cmdline", "BOOT_IMAGE=/vmlinuz root=/dev/vda\n")
    probes = probing.Probes(str(tmp_path))
    assert probes.measure({"name": "h", "probe": "hugepages", "size": "2M", "expected": "512"}) == ("512", "ok", "")
    assert probes.measure({"name": "h", "probe": "hugepages", "size": "2M", "expected": 1024})[1] == "drifted"
    _live, state, reason = probes.measure({"name": "h", "probe": "hugepages", "size": "1G", "expected": "4"})
    assert state == "not applicable" and reason.startswith("reboot pending")
    write(tmp_path, "/proc/cmdline", "root=/dev/vda hugepagesz=1G hugepages=4\n")
    assert probing.Probes(str(tmp_path)).measure({"name": "h", "probe": "hugepages", "size": "1G", "expected": "4"})[1] \
        == "drifted"


def test_cpufreq_probes(tmp_path):
    check = {"name": "g", "probe": "governor", "expected": "performance", "live": True}
    assert probing.Probes(str(tmp_path)).measure(check) == (None, "not applicable", "not applicable: no cpufreq driver")
    (tmp_path / "sys/devices/system/cpu/cpu0/cpufreq").mkdir(parents=True)
    for n, governor in ((0, "performance"), (1, "powersave"), (10, "performance")):
        write(tmp_path, f"/sys/devices/system/cpu/cpufreq/policy{n}/scaling_governor", governor + "\n")
    live, state, reason = probing.Probes(str(tmp_path)).measure(check)
    assert state == "drifted" and live == "policy0=performance, policy1=powersave, policy10=performance"
    assert "1 of 3" in reason and "policy1)" in reason
    assert probing.Probes(str(tmp_path)).measure({**check, "probe": "epp"})[1] == "not applicable"


def test_tuned_probe_drifts_when_the_profile_directory_is_gone(tmp_path):
    check = {"name": "t", "probe": "tuned", "expected": "provisioner-ml", "profile_dir": "/etc/tuned/provisioner-ml"}
    assert probing.Probes(str(tmp_path)).measure(check) == (
        None, "drifted", "the profile's directory /etc/tuned/provisioner-ml is gone")
    (tmp_path / "etc/tuned/provisioner-ml").mkdir(parents=True)
    assert probing.Probes(str(tmp_path)).measure(check)[1] == "not applicable"  # no systemd as PID 1 in tmp_path


# ---------------------------------------------------------------- login shell and service environments


def test_env_parsing():
    text = "HOME=/home/ml\nOMP_NUM_THREADS=8\nLS_COLORS=a=b:c=d\n  continued line\n=odd\nKMP_AFFINITY=granularity=core,none\n"
    assert common.parse_env(text) == {"HOME": "/home/ml", "OMP_NUM_THREADS": "8", "LS_COLORS": "a=b:c=d",
                                      "KMP_AFFINITY": "granularity=core,none"}


def test_login_env_runs_one_login_shell_per_user(monkeypatch):
    calls = []

    def fake_run(argv, timeout=60):
        calls.append(argv)
        return 0, "OMP_NUM_THREADS=64\nMKL_NUM_THREADS=8\n", ""

    monkeypatch.setattr(probing, "run", fake_run)
    probes = probing.Probes()
    omp = probes.measure({"name": "o", "probe": "login_env", "user": "ml", "var": "OMP_NUM_THREADS", "expected": "8"})
    mkl = probes.measure({"name": "m", "probe": "login_env", "user": "ml", "var": "MKL_NUM_THREADS", "expected": "8"})
    gone = probes.measure({"name": "n", "probe": "login_env", "user": "ml", "var": "NUMEXPR_NUM_THREADS", "expected": "8"})
    assert omp == ("64", "drifted", "a login shell of ml has OMP_NUM_THREADS=64")
    assert mkl == ("8", "ok", "")
    assert gone == ("(unset)", "drifted", "a login shell of ml has no NUMEXPR_NUM_THREADS")
    assert calls == [["runuser", "-l", "ml", "-c", "env"]]


def test_service_env_needs_systemd_as_pid1(tmp_path, monkeypatch):
    check = {"name": "s", "probe": "service_env", "var": "OMP_NUM_THREADS", "expected": "8"}
    assert probing.Probes(str(tmp_path)).measure(check) == (None, "not applicable", "not applicable: systemd is not PID 1")
    write(tmp_path, "/proc/1/comm", "systemd\n")
    (tmp_path / "run/systemd/system").mkdir(parents=True)
    monkeypatch.setattr(probing, "run", lambda argv, timeout=60: (0, "OMP_NUM_THREADS=8\n", ""))
    assert probing.Probes(str(tmp_path)).measure(check) == ("8", "ok", "")


def test_doctor_reading():
    ok = {"ok": True, "checks": [{"name": "blas-kernel", "status": "pass", "detail": "OpenBLAS SkylakeX"},
                                 {"name": "openmp", "status": "pass", "detail": "one runtime: GNU libgomp"}]}
    assert probing.doctor_reading(ok) == ("pass (blas-kernel: OpenBLAS SkylakeX; openmp: one runtime: GNU libgomp)", "ok", "")
    bad = {"ok": False, "checks": [{"name": "blas-kernel", "status": "fail", "detail": "Haswell on AVX-512"},
                                   {"name": "openmp", "status": "fail", "detail": "2 OpenMP runtimes"}]}
    assert probing.doctor_reading(bad) == ("fail", "drifted", "blas-kernel: Haswell on AVX-512; openmp: 2 OpenMP runtimes")


# ---------------------------------------------------------------- the comparison, the files, the exit code


def test_comparison():
    assert probing.compare("10", "10", "x") == ("10", "ok", "")
    assert probing.compare("4096 131072", "4096\t131072", "x")[1] == "ok"
    assert probing.compare("60", "10", "at boot 60") == ("60", "drifted", "at boot 60")
    assert probing.compare(None, "10", "missing")[1] == "drifted"


def expected_dir(tmp_path: Path, docs: dict[str, object]) -> Path:
    d = tmp_path / "expected"
    d.mkdir()
    for role, doc in docs.items():
        (d / f"{role}.json").write_text(doc if isinstance(doc, str) else json.dumps(doc))
    return d


def fake_root(tmp_path: Path, swappiness: str) -> Path:
    root = tmp_path / "root"
    write(root, "/etc/sysctl.d/60-provisioner-cpu.conf", f"vm.swappiness = {swappiness}\n")
    write(root, "/sys/kernel/mm/transparent_hugepage/enabled", "always [madvise] never\n")
    return root


CPU = {"schema": 1, "role": "cpu_tuning", "checks": [
    {"name": "swappiness", "probe": "sysctl", "key": "vm.swappiness", "expected": "10", "live": False},
    {"name": "THP enabled", "probe": "thp", "path": "/sys/kernel/mm/transparent_hugepage/enabled", "expected": "madvise"},
    {"name": "CPU governor", "probe": "governor", "expected": "performance", "live": True},
]}


@pytest.mark.parametrize(("swappiness", "code", "drifted"), [("10", 0, 0), ("60", 1, 1)])
def test_main_json_and_exit_code(tmp_path, capsys, swappiness, code, drifted):
    d = expected_dir(tmp_path, {"cpu_tuning": CPU, "hugepages": {"schema": 1, "role": "hugepages", "checks": []}})
    root = fake_root(tmp_path, swappiness)
    rc = cli.main(["--expected-dir", str(d), "--json"], probes_factory=lambda: probing.Probes(str(root)))
    out = json.loads(capsys.readouterr().out)
    assert rc == code and out["drifted"] == drifted and out["schema"] == 1 and out["host"]
    assert [(s["role"], s["name"], s["state"]) for s in out["settings"]] == [
        ("cpu_tuning", "swappiness", "ok" if code == 0 else "drifted"),
        ("cpu_tuning", "THP enabled", "ok"),
        ("cpu_tuning", "CPU governor", "not applicable"),
    ]
    assert set(out["settings"][0]) == {"role", "name", "probe", "expected", "live", "state", "reason"}


def test_table_lists_drift_first_with_both_values(tmp_path, capsys):
    d = expected_dir(tmp_path, {"cpu_tuning": CPU})
    root = fake_root(tmp_path, "60")
    assert cli.main(["--expected-dir", str(d)], probes_factory=lambda: probing.Probes(str(root))) == 1
    lines = capsys.readouterr().out.splitlines()
    assert lines[1].split()[:4] == ["cpu_tuning", "swappiness", "10", "at"] and "drifted" in lines[1]
    assert "60" in lines[1] and "1 drifted of 3 settings" in lines[-1]


@pytest.mark.parametrize(("docs", "named"), [
    ({"cpu_tuning": "{not json"}, "cpu_tuning.json"),
    ({"storage": {"schema": 2, "role": "storage", "checks": []}}, "storage.json"),
    ({"storage": {"schema": 1, "role": "storage", "checks": [{"name": "x", "probe": "nope", "expected": "1"}]}},
     "storage.json"),
])
def test_bad_input_exits_2_naming_the_file(tmp_path, capsys, docs, named):
    d = expected_dir(tmp_path, docs)
    assert cli.main(["--expected-dir", str(d)]) == 2
    assert named in capsys.readouterr().err


def test_missing_expected_dir_exits_2(tmp_path, capsys):
    assert cli.main(["--expected-dir", str(tmp_path / "none")]) == 2
    assert "provisioner up" in capsys.readouterr().err


def test_an_unreadable_expected_file_exits_2(tmp_path, capsys):
    d = expected_dir(tmp_path, {})
    (d / "thread_env.json").mkdir()  # a directory: open() fails as for a file root cannot read
    assert cli.main(["--expected-dir", str(d)]) == 2
    assert "thread_env.json" in capsys.readouterr().err


# ---------------------------------------------------------------- the textfile, parsed back

PLAN = {"values": {"swappiness": 10, "threads_per_job": 8, "thp_enabled": "madvise", "cpu_boost": True,
                   "numa_balancing": None, "kmp_blocktime": 1.5, "drives": ["a"]}}


@pytest.mark.parametrize("use_client", [True, False], ids=["prometheus_client", "standard library"])
def test_textfile_parses_with_prometheus_client(tmp_path, use_client):
    parser = pytest.importorskip("prometheus_client.parser")
    result = report.report([
        {"role": "cpu_tuning", "name": "swappiness", "probe": "sysctl", "expected": "10", "live": "60",
         "state": "drifted", "reason": ""},
        {"role": "thread_env", "name": 'OMP_NUM_THREADS in a "login" shell', "probe": "login_env", "expected": "8",
         "live": "8", "state": "ok", "reason": ""},
        {"role": "cpu_tuning", "name": "CPU governor", "probe": "governor", "expected": "performance", "live": None,
         "state": "not applicable", "reason": "not applicable: no cpufreq driver"},
    ], 0.1, host="box")
    out = tmp_path / "textfile"
    out.mkdir()
    path = report.write_textfile(str(out), report.metric_samples(result, PLAN, 1700000000.0), use_client=use_client)
    assert path == str(out / "provisioner_status.prom") and os.listdir(out) == ["provisioner_status.prom"]
    assert oct(os.stat(path).st_mode & 0o777) == "0o644"
    samples: dict[str, list[tuple[dict[str, str], float]]] = {}
    for family in parser.text_string_to_metric_families(Path(path).read_text()):
        for s in family.samples:
            samples.setdefault(s.name, []).append((dict(s.labels), s.value))
    assert sorted(samples["provisioner_setting_drifted"], key=str) == sorted([
        ({"role": "cpu_tuning", "setting": "swappiness"}, 1.0),
        ({"role": "thread_env", "setting": 'OMP_NUM_THREADS in a "login" shell'}, 0.0),
    ], key=str)
    assert samples["provisioner_settings_drifted"] == [({}, 1.0)]
    assert samples["provisioner_status_last_run_timestamp_seconds"] == [({}, 1700000000.0)]
    assert sorted(samples["provisioner_plan_value"], key=str) == sorted([
        ({"key": "swappiness"}, 10.0), ({"key": "threads_per_job"}, 8.0), ({"key": "cpu_boost"}, 1.0),
        ({"key": "kmp_blocktime"}, 1.5)], key=str)
    assert samples["provisioner_plan_info"] == [({"key": "thp_enabled", "value": "madvise"}, 1.0)]


def test_main_writes_the_textfile_and_refuses_a_missing_directory(tmp_path, capsys):
    d = expected_dir(tmp_path, {"cpu_tuning": CPU})
    root = fake_root(tmp_path, "10")
    plan = tmp_path / "plan.json"
    plan.write_text(json.dumps(PLAN))
    out = tmp_path / "textfile"
    out.mkdir()
    args = ["--expected-dir", str(d), "--plan", str(plan), "--textfile", str(out)]
    assert cli.main(args, probes_factory=lambda: probing.Probes(str(root))) == 0
    text = (out / "provisioner_status.prom").read_text()
    assert 'provisioner_setting_drifted{role="cpu_tuning",setting="swappiness"} 0.0' in text
    assert "CPU governor" not in text  # not applicable: absent
    assert cli.main([*args[:-1], str(tmp_path / "none")]) == 2


def test_file_probe_compares_the_content_by_sha256(tmp_path):
    import hashlib

    path = write(tmp_path, "/etc/provisioner/serving/serving.json", '{"schema": 1}\n')
    digest = "sha256:" + hashlib.sha256(path.read_bytes()).hexdigest()
    check = {"name": "config", "probe": "file", "path": "/etc/provisioner/serving/serving.json", "expected": digest}
    assert probing.Probes(str(tmp_path)).measure(check) == (digest, "ok", "")
    path.write_text('{"schema": 1, "port": 80}\n')
    live, state, reason = probing.Probes(str(tmp_path)).measure(check)
    assert state == "drifted" and live != digest and "changed since the role wrote it" in reason
    path.unlink()
    assert probing.Probes(str(tmp_path)).measure(check) == (None, "drifted", "/etc/provisioner/serving/serving.json is gone")


def test_unit_probe_reads_active_and_enabled(tmp_path, monkeypatch):
    check = {"name": "u", "probe": "unit", "unit": "provisioner-serve@0.service", "expected": "active enabled"}
    assert probing.Probes(str(tmp_path)).measure(check)[1] == "not applicable"
    write(tmp_path, "/proc/1/comm", "systemd\n")
    (tmp_path / "run/systemd/system").mkdir(parents=True)
    answers = {"is-active": "failed\n", "is-enabled": "enabled\n"}
    monkeypatch.setattr(probing, "run", lambda argv, timeout=60: (3, answers[argv[1]], ""))
    assert probing.Probes(str(tmp_path)).measure(check) == (
        "failed enabled",
        "drifted",
        "provisioner-serve@0.service is failed enabled",
    )
    answers["is-active"] = "active\n"
    assert probing.Probes(str(tmp_path)).measure(check) == ("active enabled", "ok", "")


# ---------------------------------------------------------------- where a drifted variable is set (real bash)

NAMES = ["OMP_NUM_THREADS", "MKL_NUM_THREADS", "OPENBLAS_NUM_THREADS", "NUMEXPR_NUM_THREADS", "BLIS_NUM_THREADS",
         "VECLIB_MAXIMUM_THREADS", "POLARS_MAX_THREADS"]
# What role thread_env writes (its template's first line and one `:=` line per variable).
OURS = "# Managed by provisioner (role thread_env): thread settings from the tuning plan for login shells.\n" + "".join(
    f': "${{{n}:=2}}"; export {n}\n' for n in NAMES
)


def login_home(base: Path) -> Path:
    """A home whose ~/.bash_profile reads its own profile.d as /etc/profile reads the system's:
    00-lib.sh (a function), 60-provisioner-threads.sh (ours), 70-same.sh, zz-drift.sh."""
    home = base / "home"
    write(home, ".bash_profile", 'for f in "$HOME"/profile.d/*.sh; do . "$f"; done\n')
    write(home, "profile.d/00-lib.sh", "# helpers\nthreads() {\n  export BLIS_NUM_THREADS=$1\n}\n")
    write(home, "profile.d/60-provisioner-threads.sh", OURS)
    write(home, "profile.d/70-same.sh", "export OPENBLAS_NUM_THREADS=64\n")
    write(home, "profile.d/zz-drift.sh", "\n".join([
        "# a user's own settings",
        "export OMP_NUM_THREADS=64",
        "OPENBLAS_NUM_THREADS=64",                      # 4: the same value again: the last assignment wins
        "(export NUMEXPR_NUM_THREADS=9)",               # 5: a subshell's assignment does not last
        "x=$(MKL_NUM_THREADS=5; echo $MKL_NUM_THREADS)",  # 6: nor a command substitution's
        "MKL_NUM_THREADS=7 true",                       # 7: nor an assignment for one command
        "threads 3",                                    # 8: the function's line in 00-lib.sh sets it
        "unset VECLIB_MAXIMUM_THREADS",                 # 9
        "",
    ]))
    for p in home.rglob("*"):
        p.chmod(0o755 if p.is_dir() else 0o644)
    home.chmod(0o755)
    return home


def rel(found, home: Path):
    return {n: (os.path.relpath(v[0], home), v[1]) if v else None for n, v in found.items()}


WANT = {
    "OMP_NUM_THREADS": ("profile.d/zz-drift.sh", 2),
    "OPENBLAS_NUM_THREADS": ("profile.d/zz-drift.sh", 3),
    "NUMEXPR_NUM_THREADS": ("profile.d/60-provisioner-threads.sh", 5),  # ours: the `:=` changed nothing visible but the value
    "MKL_NUM_THREADS": ("profile.d/60-provisioner-threads.sh", 3),
    "BLIS_NUM_THREADS": ("profile.d/00-lib.sh", 3),
    "VECLIB_MAXIMUM_THREADS": ("profile.d/zz-drift.sh", 8),
    "POLARS_MAX_THREADS": None,  # in the environment before the profile ran: no file of the shell set it
}


def test_the_trace_names_the_last_file_and_line_that_set_each_variable_in_roots_login(tmp_path):
    """root's login (bash takes no PS4 from the environment as root): the emulated login order,
    run for real."""
    home = login_home(tmp_path)
    argv, env = sources.login_trace("root", NAMES, 0, str(home))
    assert argv[:3] == ["/bin/bash", "--noprofile", "--norc"] and env["HOME"] == str(home)
    r = subprocess.run(argv, env={**env, "POLARS_MAX_THREADS": "7"}, capture_output=True, text=True, timeout=60, check=False)
    assert r.returncode == 0, r.stderr
    assert rel(sources.parse_trace(r.stderr, NAMES), home) == WANT


@pytest.fixture
def open_dir():
    """A directory another user can read (pytest's tmp_path is root's own)."""
    path = Path(tempfile.mkdtemp(prefix="status-login-"))
    path.chmod(0o755)
    yield path
    shutil.rmtree(path, ignore_errors=True)


def test_the_trace_of_a_real_login_shell_of_another_user(open_dir):
    """Another user's login shell takes PS4 and SHELLOPTS=xtrace from the environment (runuser -w
    lets them through), so the trace starts before /etc/profile: bash -l, run as nobody here."""
    home = login_home(open_dir)
    argv, env = sources.login_trace("ml", NAMES, 1000, "/home/ml")
    assert argv == ["runuser", "-l", "ml", "-s", "/bin/bash", "-w", "PS4,SHELLOPTS", "-c", "true"]
    assert env["SHELLOPTS"] == "xtrace" and env["PS4"] == sources.trace_ps4(NAMES)
    as_user = ["setpriv", "--reuid=65534", "--regid=65534", "--clear-groups", "--"] if os.geteuid() == 0 else []
    login = {"PATH": env["PATH"], "HOME": str(home), "PS4": env["PS4"], "SHELLOPTS": "xtrace", "POLARS_MAX_THREADS": "7"}
    r = subprocess.run([*as_user, "/bin/bash", "-l", "-c", "true"], env=login, capture_output=True, text=True, timeout=60,
                       check=False, cwd=home)
    assert r.returncode == 0, r.stderr
    found = sources.parse_trace(r.stderr, NAMES)
    assert rel(found, home) == WANT
    assert found["OMP_NUM_THREADS"][2] in ("export OMP_NUM_THREADS=64", "OMP_NUM_THREADS=64")


def test_no_trace_is_no_answer():
    assert sources.parse_trace("+ export OMP_NUM_THREADS=64\nsome output\n", ["OMP_NUM_THREADS"]) == {}


@pytest.mark.parametrize(("command", "sets"), [
    ("OMP_NUM_THREADS=64", True), ("export OMP_NUM_THREADS=64", True), ("declare -x OMP_NUM_THREADS=1", True),
    ("A=1 OMP_NUM_THREADS=2", True), ("unset OMP_NUM_THREADS", True), ("unset -v A OMP_NUM_THREADS", True),
    ("OMP_NUM_THREADS=1 python x.py", False), ("export OMP_NUM_THREADS", False), ("echo OMP_NUM_THREADS=1", False),
    ("export OMP_NUM_THREADS_X=1", False), ("'unbalanced", False),
])
def test_which_traced_commands_set_a_variable(command, sets):
    assert sources.assigns(command, "OMP_NUM_THREADS") is sets


def test_managed_by_provisioner_by_header_or_block():
    assert sources.managed_by_provisioner(OURS, 3)
    pam = "# site\nOMP_NUM_THREADS DEFAULT=64\n# BEGIN provisioner thread_env\nOMP_NUM_THREADS DEFAULT=2\n# END provisioner thread_env\n"
    assert sources.managed_by_provisioner(pam, 4) and not sources.managed_by_provisioner(pam, 2)
    assert not sources.managed_by_provisioner("export OMP_NUM_THREADS=64\n", 1)


def manager_root(tmp_path: Path) -> Path:
    root = tmp_path / "root"
    write(root, "/etc/systemd/system.conf", "[Manager]\n#DefaultEnvironment=\n")
    write(root, "/etc/systemd/system.conf.d/60-provisioner-threads.conf",
          "# Managed by provisioner (role thread_env)\n[Manager]\nDefaultEnvironment=\"OMP_NUM_THREADS=2\" \"MKL_NUM_THREADS=2\"\n")
    write(root, "/etc/systemd/system.conf.d/zz-mine.conf", "[Manager]\n# mine\nDefaultEnvironment=OMP_NUM_THREADS=64 X=1\n")
    write(root, "/usr/lib/systemd/system.conf.d/zz-mine.conf", "[Manager]\nDefaultEnvironment=OMP_NUM_THREADS=9\n")  # hidden
    write(root, "/usr/lib/systemd/system.conf.d/90-vendor.conf", "[Manager]\nDefaultEnvironment=MKL_NUM_THREADS=5\n")
    (root / "etc/systemd/system.conf.d/90-vendor.conf").symlink_to("/dev/null")  # masked
    write(root, "/run/systemd/system.conf.d/95-other.conf", "[Service]\nDefaultEnvironment=MKL_NUM_THREADS=6\n")  # not [Manager]
    return root


def test_a_services_variable_is_traced_to_the_manager_drop_in_that_sets_it(tmp_path):
    root = manager_root(tmp_path)
    files = sources.manager_conf_files(str(root))
    assert files == ["/etc/systemd/system.conf", "/etc/systemd/system.conf.d/60-provisioner-threads.conf",
                     "/run/systemd/system.conf.d/95-other.conf", "/etc/systemd/system.conf.d/zz-mine.conf"]
    assert sources.default_environment("OMP_NUM_THREADS", files, str(root)) == (
        "64", "/etc/systemd/system.conf.d/zz-mine.conf", 3)
    assert sources.default_environment("MKL_NUM_THREADS", files, str(root))[1:] == (
        "/etc/systemd/system.conf.d/60-provisioner-threads.conf", 3)
    probes = probing.Probes(str(root))
    check = {"probe": "service_env", "var": "OMP_NUM_THREADS"}
    assert probes.source(check, "64") == {"file": "/etc/systemd/system.conf.d/zz-mine.conf", "line": 3,
                                          "managed_by_provisioner": False}
    # A value no file gives: set at run time (systemctl set-environment).
    assert probes.source(check, "12")["how"] == "systemctl set-environment"
    assert probes.source({"probe": "service_env", "var": "MKL_NUM_THREADS"}, "2")["managed_by_provisioner"] is True
    # Unset and no file sets it: the role's drop-in is gone, a run writes it again.
    assert probes.source({"probe": "service_env", "var": "BLIS_NUM_THREADS"}, "(unset)") is None
    write(root, "/etc/systemd/system.conf.d/zz-reset.conf", "[Manager]\nDefaultEnvironment=\n")
    assert sources.default_environment("OMP_NUM_THREADS", sources.manager_conf_files(str(root)), str(root)) == (None, None, None)


def test_status_names_the_file_and_what_repairs_it(tmp_path, capsys, monkeypatch):
    """main --json and the table with a drifted login variable a user's file sets: the ML user
    is root here (its login is emulated: runuser needs a real user), the trace runs for real."""
    home = login_home(tmp_path)
    real_run = common.run

    def run(argv, timeout=60, env=None):
        if argv[:2] == ["runuser", "-l"]:  # the login_env probe's `runuser -l ml -c env`
            return 0, "OMP_NUM_THREADS=64\nMKL_NUM_THREADS=2\nNUMEXPR_NUM_THREADS=3\n", ""
        return real_run(argv, timeout, env)

    class Entry:
        pw_uid, pw_dir = 0, str(home)

    monkeypatch.setattr(probing, "run", run)
    monkeypatch.setattr(probing.pwd, "getpwnam", lambda user: Entry)
    checks = [{"name": f"{n} in a login shell of ml", "probe": "login_env", "user": "ml", "var": n, "expected": "2"}
              for n in ("OMP_NUM_THREADS", "MKL_NUM_THREADS", "NUMEXPR_NUM_THREADS")]
    d = expected_dir(tmp_path, {"thread_env": {"schema": 1, "role": "thread_env", "checks": checks}})
    textfile = tmp_path / "textfile"
    textfile.mkdir()
    assert cli.main(["--expected-dir", str(d), "--json", "--textfile", str(textfile)]) == 1
    out = {s["name"].split()[0]: s for s in json.loads(capsys.readouterr().out)["settings"]}
    omp = out["OMP_NUM_THREADS"]
    drift = str(home / "profile.d/zz-drift.sh")
    assert omp["state"] == "drifted" and omp["source"] == {"file": drift, "line": 2, "managed_by_provisioner": False}
    assert omp["repair"] == (f"set by {drift} line 2, not by provisioner: remove or change that line; "
                             "`provisioner up` cannot repair it")
    assert out["MKL_NUM_THREADS"]["state"] == "ok" and "source" not in out["MKL_NUM_THREADS"]
    # Our own file set the wrong value (changed by hand): a run repairs it, so no "repair".
    ours = out["NUMEXPR_NUM_THREADS"]
    assert ours["source"]["managed_by_provisioner"] is True and "repair" not in ours
    # The metrics do not change shape: one 0/1 sample per setting.
    prom = (textfile / "provisioner_status.prom").read_text()
    assert 'provisioner_setting_drifted{role="thread_env",setting="OMP_NUM_THREADS in a login shell of ml"} 1.0' in prom
    assert cli.main(["--expected-dir", str(d)]) == 1
    row = next(ln for ln in capsys.readouterr().out.splitlines() if ln.startswith("thread_env  OMP"))
    assert row.endswith(f"drifted: a login shell of ml has OMP_NUM_THREADS=64; {omp['repair']}")


def test_link_probe_reads_the_ml_environments_live_generation_and_the_textfile_names_it(tmp_path):
    store = tmp_path / "opt" / "mlstack-envs"
    (store / "aaaaaaaaaaaa").mkdir(parents=True)
    (store / "bbbbbbbbbbbb").mkdir()
    link = tmp_path / "opt" / "mlstack"
    link.symlink_to("/opt/mlstack-envs/aaaaaaaaaaaa")
    check = {"role": "mlstack", "name": "ML environment generation", "probe": "link", "path": "/opt/mlstack",
             "expected": "/opt/mlstack-envs/aaaaaaaaaaaa", "detail": "rolled back"}
    probes = probing.Probes(str(tmp_path))
    assert probes.measure(check) == ("/opt/mlstack-envs/aaaaaaaaaaaa", "ok", "")
    link.unlink()
    link.symlink_to("/opt/mlstack-envs/bbbbbbbbbbbb")
    assert probes.measure(check) == ("/opt/mlstack-envs/bbbbbbbbbbbb", "drifted", "rolled back")
    result = report.report(report.measure_all([check], probes), 0.1, host="box")
    samples = report.metric_samples(result, {}, 1.0)
    [info] = [m for m in samples if m[0] == "provisioner_mlstack_generation_info"]
    assert info[3] == [({"generation": "bbbbbbbbbbbb", "expected": "aaaaaaaaaaaa"}, 1.0)]
    link.unlink()
    link.mkdir()
    assert probes.measure(check) == (None, "drifted", "/opt/mlstack is not a symlink")

"""Generations of the ML environment (module provisioner_mlstack_generation and the start-up hook
provisioner_generation), on real directories and real virtual environments made with this
machine's Python: the hard-link copy and its scripts, the one-rename switch, what a running
process imports after a switch, retention, the space refusal and the history."""

from __future__ import annotations

import os
import subprocess
import sys
import time
from pathlib import Path

import plugin_code
import pytest

REPO = Path(__file__).resolve().parents[2]
FILES = REPO / "roles" / "mlstack" / "files"
gen = plugin_code.load("modules", "provisioner_mlstack_generation")

A, B, C = "aaaaaaaaaaaa", "bbbbbbbbbbbb", "cccccccccccc"


def params(tmp: Path, state: str, name: str | None = None, **extra) -> dict:
    return {
        "link": str(tmp / "mlstack"),
        "store": str(tmp / "mlstack-envs"),
        "state": state,
        "name": name,
        "clone": True,
        "keep": 2,
        "services": [],
        **extra,
    }


def run(tmp: Path, state: str, name: str | None = None, check: bool = False, **extra) -> dict:
    return gen.run(params(tmp, state, name, **extra), check)


def site_packages(env: Path) -> Path:
    return env / "lib" / f"python{sys.version_info.major}.{sys.version_info.minor}" / "site-packages"


def build(tmp: Path, name: str, version: str) -> Path:
    """Generation NAME as the role builds it: prepared (a copy of the live one, if any), a venv,
    a module `stackmod` at VERSION standing in for a package pip installed, the start-up hook."""
    result = run(tmp, "prepared", name)
    assert not result.get("failed"), result
    env = Path(result["path"])
    if not (env / "bin" / "python").exists():
        subprocess.run([sys.executable, "-m", "venv", "--without-pip", str(env)], check=True)
        (env / "bin" / "tool").write_text(f"#!{env}/bin/python\nimport stackmod\nprint(stackmod.VERSION)\n")
        (env / "bin" / "tool").chmod(0o755)
    sp = site_packages(env)
    if not (sp / "unchanged.py").exists():
        (sp / "unchanged.py").write_text("SAME = True\n")
    (sp / "stackmod.py").unlink(missing_ok=True)  # pip replaces a file: a new inode, never a write into the old one
    (sp / "stackmod.py").write_text(f"VERSION = {version!r}\n")
    for hook in ("provisioner_generation.py", "provisioner_generation.pth"):
        (sp / hook).unlink(missing_ok=True)
        (sp / hook).write_bytes((FILES / hook).read_bytes())
    return env


def wait_for(path: Path, seconds: float = 60) -> None:
    deadline = time.monotonic() + seconds
    while not path.exists():
        assert time.monotonic() < deadline, f"{path} never appeared"
        time.sleep(0.02)


def test_a_first_generation_goes_live_and_the_stable_path_is_a_symlink_to_it(tmp_path):
    build(tmp_path, A, "1.0")
    result = run(tmp_path, "live", A)
    assert result["changed"] and result["live"] == A and result["previous"] is None
    link = tmp_path / "mlstack"
    assert link.is_symlink() and os.readlink(link) == str(tmp_path / "mlstack-envs" / A)
    out = subprocess.run([str(link / "bin" / "tool")], capture_output=True, text=True, check=True)
    assert out.stdout.strip() == "1.0"
    again = run(tmp_path, "live", A)
    assert not again["changed"]
    [only] = again["generations"]
    assert only["name"] == A and only["live"] and only["bytes"] > 0 and only["own_bytes"] > 0


def test_a_new_generation_is_a_hard_link_copy_with_its_own_scripts(tmp_path):
    old = build(tmp_path, A, "1.0")
    run(tmp_path, "live", A)
    new = build(tmp_path, B, "2.0")
    # Unchanged files are shared with the live generation; what changed has its own inode, and
    # the live generation's files are as they were.
    assert (site_packages(new) / "unchanged.py").stat().st_ino == (site_packages(old) / "unchanged.py").stat().st_ino
    assert (site_packages(new) / "stackmod.py").stat().st_ino != (site_packages(old) / "stackmod.py").stat().st_ino
    assert (site_packages(old) / "stackmod.py").read_text() == "VERSION = '1.0'\n"
    # The scripts and activate name the new directory; the live generation's are unchanged.
    assert (new / "bin" / "tool").read_text().startswith(f"#!{new}/bin/python\n")
    assert (old / "bin" / "tool").read_text().startswith(f"#!{old}/bin/python\n")
    assert str(new) in (new / "bin" / "activate").read_text()
    assert str(old) not in (new / "bin" / "activate").read_text()
    assert str(old) not in (new / "pyvenv.cfg").read_text()
    # Nothing is live yet but the old one.
    assert os.path.realpath(tmp_path / "mlstack") == str(old)


def test_a_running_process_keeps_its_generation_and_a_new_one_gets_the_switched_one(tmp_path):
    build(tmp_path, A, "1.0")
    run(tmp_path, "live", A)
    build(tmp_path, B, "2.0")
    link = tmp_path / "mlstack"
    go, ready = tmp_path / "go", tmp_path / "ready"
    # A job started from the stable path before the switch that imports after it, and one process
    # it starts after the switch with sys.executable (as multiprocessing and joblib do).
    code = (
        f"import os, subprocess, sys, time\nopen({str(ready)!r}, 'w').close()\n"
        f"while not os.path.exists({str(go)!r}): time.sleep(0.02)\n"
        "import stackmod\nprint(stackmod.VERSION)\nsys.stdout.flush()\n"
        "subprocess.run([sys.executable, '-c', 'import stackmod; print(stackmod.VERSION)'], check=True)"
    )
    job = subprocess.Popen([str(link / "bin" / "python"), "-c", code], stdout=subprocess.PIPE, text=True)
    wait_for(ready)
    result = run(tmp_path, "live", B)
    assert result["changed"] and result["previous"] == A and result["live"] == B
    go.touch()
    out, _ = job.communicate(timeout=30)
    assert out.split() == ["1.0", "1.0"], "a running process and its children must keep the generation it started in"
    fresh = subprocess.run(
        [str(link / "bin" / "python"), "-c", "import stackmod; print(stackmod.VERSION)"],
        capture_output=True,
        text=True,
        check=True,
    )
    assert fresh.stdout.strip() == "2.0"


def test_without_the_hook_a_running_process_would_mix_generations(tmp_path):
    """What the hook prevents, shown once: Python keeps the symlink's path in its import path."""
    env = build(tmp_path, A, "1.0")
    run(tmp_path, "live", A)
    link = tmp_path / "mlstack"
    code = "import sys; print(sys.prefix); print([p for p in sys.path if p.endswith('site-packages')][0])"
    with_hook = subprocess.run([str(link / "bin" / "python"), "-c", code], capture_output=True, text=True, check=True)
    prefix, path = with_hook.stdout.split()
    assert prefix == str(link) and path == str(site_packages(env))
    for hook in ("provisioner_generation.py", "provisioner_generation.pth"):
        (site_packages(env) / hook).unlink()
    without = subprocess.run([str(link / "bin" / "python"), "-c", code], capture_output=True, text=True, check=True)
    assert without.stdout.split()[1] == str(site_packages(link))


def test_a_legacy_directory_is_copied_then_moved_aside_and_removed_when_unused(tmp_path):
    legacy = tmp_path / "mlstack"
    subprocess.run([sys.executable, "-m", "venv", "--without-pip", str(legacy)], check=True)
    (legacy / "bin" / "tool").write_text(f"#!{legacy}/bin/python\nprint('legacy')\n")
    assert run(tmp_path, "info")["legacy"]
    new = build(tmp_path, A, "1.0")
    assert (new / "bin" / "tool").read_text().startswith(f"#!{new}/bin/python\n")
    result = run(tmp_path, "live", A)
    assert result["moved_aside"] and Path(result["moved_aside"]).is_dir()
    assert legacy.is_symlink() and not run(tmp_path, "info")["legacy"]
    pruned = run(tmp_path, "pruned", keep=2)
    assert pruned["removed"] == [Path(result["moved_aside"]).name] and not Path(result["moved_aside"]).exists()


def test_retention_keeps_the_live_and_the_newest_others_but_never_one_a_process_runs_from(tmp_path):
    for name, version in ((A, "1"), (B, "2"), (C, "3")):
        build(tmp_path, name, version)
        run(tmp_path, "live", name)
    names = [g["name"] for g in run(tmp_path, "info")["generations"]]
    assert names == [C, B, A]  # most recently live first
    store = tmp_path / "mlstack-envs"
    # A process that runs from A (its working directory there) keeps A.
    holder = subprocess.Popen([sys.executable, "-c", "import time; time.sleep(60)"], cwd=store / A)
    try:
        check = run(tmp_path, "pruned", check=True, keep=2)
        assert check["removed"] == [] and list(check["kept_in_use"]) == [A] and (store / A).is_dir()
        assert check["kept_in_use"][A] == [holder.pid]
    finally:
        holder.kill()
        holder.wait()
    check = run(tmp_path, "pruned", check=True, keep=2)
    assert check["changed"] and check["removed"] == [A] and (store / A).is_dir()  # check mode removes nothing
    assert run(tmp_path, "pruned", keep=2)["removed"] == [A] and not (store / A).exists()
    assert run(tmp_path, "pruned", keep=1)["removed"] == [B]
    assert [g["name"] for g in run(tmp_path, "info")["generations"]] == [C]
    assert run(tmp_path, "pruned", keep=1)["changed"] is False


def test_a_pure_python_job_started_through_the_link_keeps_its_generation_from_pruning(tmp_path):
    """No compiled module mapped, its executable the system Python, its working directory
    elsewhere: the start-up hook's open directory is what shows it."""
    build(tmp_path, A, "1.0")
    run(tmp_path, "live", A)
    ready = tmp_path / "ready"
    job = subprocess.Popen(
        [str(tmp_path / "mlstack" / "bin" / "python"), "-c", f"import time\nopen({str(ready)!r}, 'w').close()\ntime.sleep(60)"],
        cwd="/",
    )
    try:
        wait_for(ready)
        build(tmp_path, B, "2.0")
        run(tmp_path, "live", B)
        pruned = run(tmp_path, "pruned", keep=1)
        assert pruned["removed"] == [] and pruned["kept_in_use"] == {A: [job.pid]}
    finally:
        job.kill()
        job.wait()
    assert run(tmp_path, "pruned", keep=1)["removed"] == [A]


def test_the_live_generation_is_never_removed_even_when_its_record_is_lost(tmp_path):
    build(tmp_path, A, "1.0")
    run(tmp_path, "live", A)
    (tmp_path / "mlstack-envs" / "generations.json").unlink()
    assert run(tmp_path, "pruned", keep=1)["removed"] == []
    assert run(tmp_path, "prepared", A)["built"] is True  # not taken for an unfinished build
    assert (tmp_path / "mlstack" / "bin" / "tool").exists()
    assert [g["name"] for g in run(tmp_path, "info")["generations"]] == [A]


def test_an_unfinished_build_is_rebuilt_from_the_live_one_and_pruned(tmp_path):
    build(tmp_path, A, "1.0")
    run(tmp_path, "live", A)
    unfinished = tmp_path / "mlstack-envs" / B
    build(tmp_path, B, "2.0")
    (unfinished / "half-written").write_text("x")
    # The next prepare starts it again from the live one.
    again = run(tmp_path, "prepared", B)
    assert again["changed"] and not (unfinished / "half-written").exists()
    assert run(tmp_path, "pruned", keep=2)["removed"] == [B]


def test_rollback_switches_to_the_previous_generation_and_a_missing_one_is_refused(tmp_path):
    build(tmp_path, A, "1.0")
    run(tmp_path, "live", A)
    build(tmp_path, B, "2.0")
    run(tmp_path, "live", B)
    back = run(tmp_path, "live", A)
    assert back["changed"] and back["previous"] == B and os.path.realpath(tmp_path / "mlstack").endswith(A)
    assert [g["name"] for g in back["generations"]] == [A, B]
    missing = run(tmp_path, "live", C)
    assert missing["failed"] and f"generation {C} does not exist" in missing["msg"]
    assert run(tmp_path, "absent", A)["failed"], "the live generation is never removed"


def test_a_build_that_would_not_fit_is_refused_before_anything_is_written(tmp_path, monkeypatch):
    build(tmp_path, A, "1.0")
    run(tmp_path, "live", A)
    own = run(tmp_path, "info")["generations"][0]["own_bytes"]
    monkeypatch.setattr(gen, "describe", lambda *a, **k: {"free_bytes": own, "live": A, "legacy": False, "generations": []})
    refused = run(tmp_path, "prepared", B)
    assert refused["failed"] and not (tmp_path / "mlstack-envs" / B).exists()
    assert "free space on that filesystem" in refused["msg"] and "GiB free" in refused["msg"]
    assert "\n" not in refused["msg"]


def test_bad_names_and_keep_are_refused_naming_the_value(tmp_path):
    assert "not a generation name" in run(tmp_path, "live", "../etc")["msg"]
    assert "keep must be 1 or more (got 0)" in run(tmp_path, "pruned", keep=0)["msg"]


def test_the_services_on_a_generation_are_found_by_cgroup_and_only_the_listed_ones_restart(tmp_path):
    proc = tmp_path / "proc"

    def process(pid: int, cwd: Path, cgroup: str) -> None:
        d = proc / str(pid)
        d.mkdir(parents=True)
        (d / "cwd").symlink_to(cwd)
        (d / "cgroup").write_text(f"0::{cgroup}\n")

    old = build(tmp_path, A, "1.0")
    process(11, old, "/system.slice/provisioner-serve.slice/provisioner-serve@1.service")
    process(12, old, "/system.slice/provisioner-serve.slice/provisioner-serve@2.service")
    process(13, old, "/user.slice/user-1000.slice/session-3.scope")  # a user's job
    process(14, old, "/system.slice/someone-elses.service")
    process(15, tmp_path, "/system.slice/provisioner-ray.service")  # not on the old generation
    units = gen.services_on([str(old)], proc=str(proc))
    assert units == ["provisioner-serve@1.service", "provisioner-serve@2.service", "someone-elses.service"]
    assert gen.matching(units, ["provisioner-serve@*.service", "provisioner-ray.service"]) == [
        "provisioner-serve@1.service",
        "provisioner-serve@2.service",
    ]


def test_undo_removes_the_link_and_every_generation(tmp_path):
    build(tmp_path, A, "1.0")
    run(tmp_path, "live", A)
    assert run(tmp_path, "absent", check=True)["changed"] and (tmp_path / "mlstack").is_symlink()
    result = run(tmp_path, "absent")
    assert result["changed"] and not (tmp_path / "mlstack").exists() and not (tmp_path / "mlstack-envs").exists()
    assert not run(tmp_path, "absent")["changed"]


@pytest.mark.parametrize(
    "text, old, new, expected",
    [
        ("#!/opt/e/abc/bin/python\n", "/opt/e/abc", "/opt/e/def", "#!/opt/e/def/bin/python\n"),
        ("#!/opt/mlstack/bin/python\n", "/opt/mlstack", "/opt/mlstack-envs/abc", "#!/opt/mlstack-envs/abc/bin/python\n"),
        ("#!/opt/e/abcdef/bin/python\n", "/opt/e/abc", "/opt/e/x", "#!/opt/e/abcdef/bin/python\n"),  # a longer name
        (
            "#!/bin/sh\n'''exec' /opt/e/abc/bin/python \"$0\" \"$@\"\n' '''\n",
            "/opt/e/abc",
            "/opt/e/d",
            "#!/bin/sh\n'''exec' /opt/e/d/bin/python \"$0\" \"$@\"\n' '''\n",
        ),
    ],
)
def test_script_interpreter_lines_are_rewritten_as_whole_paths(tmp_path, text, old, new, expected):
    (tmp_path / "bin").mkdir()
    (tmp_path / "bin" / "s").write_text(text)
    gen.rewrite_prefix(str(tmp_path), old, new)
    assert (tmp_path / "bin" / "s").read_text() == expected

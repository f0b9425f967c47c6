"""What the common role promises, checked on the target."""

from __future__ import annotations

import json

import pytest

from provisioner.checks import as_root, role_vars


@pytest.fixture()
def common(host):
    return role_vars(host, "common")


def test_base_packages_installed(host, common):
    missing = [p for p in common["common_packages"] + common["common_extra_packages"] if not host.package(p).is_installed]
    assert missing == [], f"packages not installed: {missing}"


def test_ml_user_is_unprivileged(host, common):
    user = host.user(common["common_ml_user"])
    assert user.exists
    assert user.uid >= 1000
    assert user.group == common["common_ml_group"]
    assert user.home == common["common_ml_home"]
    assert host.file(common["common_ml_home"]).is_directory
    assert host.file(common["common_ml_home"]).user == common["common_ml_user"]


def test_ml_user_has_no_password_login(host, common):
    with as_root(host):
        password = host.user(common["common_ml_user"]).password
    assert password in ("!", "*", "!*"), "the ML user must not have a usable password"


@pytest.mark.parametrize("key", ["common_config_dir", "common_state_dir"])
def test_provisioner_directories(host, common, key):
    d = host.file(common[key])
    assert d.is_directory
    assert d.user == "root"
    assert d.mode == 0o755


def test_applied_plan_recorded(host, common):
    plan = host.file(f"{common['common_config_dir']}/plan.json")
    assert plan.exists, "plan.json missing: run provisioner up"
    data = json.loads(plan.content_string)
    assert data["values"]["threads_per_job"] >= 1


def test_system_python_left_to_apt(host):
    """PEP 668: the system Python stays externally managed; the ML stack lives in a venv."""
    system_python = "/usr/bin/python3"  # Debian's, whatever else is first on PATH
    stdlib = host.check_output(f"{system_python} -c 'import sysconfig; print(sysconfig.get_path(\"stdlib\"))'")
    assert host.file(f"{stdlib}/EXTERNALLY-MANAGED").exists
    assert host.run(f"{system_python} -m venv --help").rc == 0

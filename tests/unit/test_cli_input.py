"""Bad input is refused with one line naming the problem and the fix, exit code 2."""

from __future__ import annotations

from pathlib import Path

import pytest
from typer.testing import CliRunner

from provisioner import __version__, engine, options
from provisioner.cli import app
from provisioner.errors import BadInput, ExitCode

runner = CliRunner()


def invoke(*args: str):
    result = runner.invoke(app, list(args))
    if result.exit_code == ExitCode.BAD_INPUT and result.stderr.startswith("error:"):
        assert len(result.stderr.strip().splitlines()) == 1, "an error must be one line"
    return result


def test_version():
    result = invoke("--version")
    assert result.exit_code == 0
    assert __version__ in result.stdout


# Refused with exit code 2 before any run: the command line ({tmp}: a fresh directory), the inventory
# it finds there as hosts.yml (None: no file), what the error line must say.
REFUSED = {
    "missing inventory": (("up", "-i", "{tmp}/nope.yml"), None, ("does not exist", "nope.yml")),
    "malformed YAML names the line": (
        ("up", "-i", "{tmp}/hosts.yml"),
        "all:\n  hosts:\n    a: {ansible_host: 10.0.0.1\n",
        ("not valid YAML at line 4",),
    ),
    "inventory without hosts": (("plan", "-i", "{tmp}/hosts.yml"), "all:\n  children:\n    web: {}\n", ("defines no hosts",)),
    "unknown tag lists the known ones": (("up", "--tags", "comon", "--check"), None, ("unknown tag(s) comon", "common")),
    "rollback to a name no generation has": (("rollback", "--to", "../x"), None, ("--to '../x' is not a generation's name",)),
    "unknown option suggests a close one": (
        ("up", "--check", "-e", "common_ml_usr=bob"),
        None,
        ("unknown option 'common_ml_usr'", "common_ml_user"),
    ),
}


@pytest.mark.parametrize("case", REFUSED)
def test_bad_input_is_refused_naming_it(tmp_path: Path, case: str):
    args, inventory, said = REFUSED[case]
    if inventory is not None:
        (tmp_path / "hosts.yml").write_text(inventory)
    result = invoke(*(arg.replace("{tmp}", str(tmp_path)) for arg in args))
    assert result.exit_code == ExitCode.BAD_INPUT
    assert [words for words in said if words not in result.stderr] == [], result.stderr


def test_option_without_value_separator():
    with pytest.raises(BadInput, match="not KEY=VALUE"):
        options.parse_extra_vars(["common_ml_user"])


def test_option_values_are_yaml():
    assert options.parse_extra_vars(["common_extra_packages=[htop, jq]", "common_ml_uid=2000"]) == {
        "common_extra_packages": ["htop", "jq"],
        "common_ml_uid": 2000,
    }


def test_unknown_cli_flag_is_a_usage_error():
    result = invoke("up", "--frobnicate")
    assert result.exit_code == 2


def test_every_role_option_is_documented():
    known = options.known_options()
    assert {"common_ml_user", "common_packages"} <= set(known)


def test_the_internal_roles_arguments_are_no_user_options():
    assert "shared_role" not in options.known_options()
    with pytest.raises(BadInput, match="unknown option 'shared_originals'"):
        options.parse_extra_vars(["shared_originals={}"])


def test_known_tags_cover_roles_and_phases():
    tags = engine.known_tags()
    assert {"common", "common_preflight", "common_install", "common_configure", "plan"} <= tags


@pytest.mark.parametrize(
    ("msg", "expected"),
    [
        ("Failed to connect to the host via ssh: @@@ WARNING: REMOTE HOST IDENTIFICATION HAS CHANGED! @@@", "host key changed"),
        (
            "Failed to connect to the host via ssh: No ED25519 host key is known for 10.1.1.2 and you have requested strict checking.\r\nHost key verification failed.",
            "not in known_hosts",
        ),
        ("Failed to connect to the host via ssh: root@10.1.1.2: Permission denied (publickey).", "login was refused"),
        (
            "Failed to connect to the host via ssh: ssh: Could not resolve hostname nosuch: Name or service not known",
            "does not resolve",
        ),
        ("Failed to connect to the host via ssh: ssh: connect to host 127.0.0.1 port 1: Connection refused", "unreachable"),
    ],
)
def test_unreachable_messages_name_the_fix(msg: str, expected: str):
    line = engine.explain_unreachable("web1", msg)
    assert line.startswith("web1: ")
    assert expected in line.replace("SSH host key changed", "host key changed")
    assert "\n" not in line


def test_mitogens_host_key_refusal_is_a_changed_key_when_first_seen_keys_are_trusted():
    msg = "Host key checking is enabled, and SSH reported an unrecognized or mismatching host key."
    trusting = engine.explain_unreachable("web1", msg, accept_new_host_keys=True)
    assert "host key changed" in trusting.replace("SSH host key changed", "host key changed") and "ssh-keygen -R" in trusting
    strict = engine.explain_unreachable("web1", msg)
    assert "not in known_hosts" in strict and "--accept-new-host-keys" in strict and "ssh-keygen -R" in strict


def test_option_values_outside_their_choices_are_refused():
    with pytest.raises(BadInput, match=r"-e smoke_workloads: bogus is not one of gemm, triad"):
        options.parse_extra_vars(["smoke_workloads=[gemm,bogus]"])
    with pytest.raises(BadInput, match=r"-e smoke_profile: huge is not one of quick, full"):
        options.parse_extra_vars(["smoke_profile=huge"])
    assert options.parse_extra_vars(["smoke_workloads=[gemm, hpo]"]) == {"smoke_workloads": ["gemm", "hpo"]}


def test_smoke_refuses_bad_options_before_touching_a_host():
    result = runner.invoke(app, ["smoke", "-e", "smoke_workloads=[nope]"])
    assert result.exit_code == ExitCode.BAD_INPUT
    assert "smoke_workloads: nope is not one of" in result.output


def fleet_inventory(tmp_path: Path) -> Path:
    """Two hosts in group web at lab addresses nothing answers on (nothing may connect to them)."""
    inv = tmp_path / "hosts.yml"
    inv.write_text(
        "all:\n  children:\n    web:\n      hosts:\n"
        "        web1: {ansible_host: 10.213.250.2}\n        web2: {ansible_host: 10.213.250.3}\n"
    )
    return inv


@pytest.mark.parametrize("limit, unmatched", [("nosuchhost", "nosuchhost"), ("web1,wbe2", "wbe2"), ("web:&db", "&db")])
def test_a_limit_that_matches_no_host_is_refused_before_any_run(tmp_path: Path, monkeypatch, limit: str, unmatched: str):
    monkeypatch.setenv("PROVISIONER_STATE_DIR", str(tmp_path / "state"))
    result = invoke("facts", "-i", str(fleet_inventory(tmp_path)), "--limit", limit)
    assert result.exit_code == ExitCode.BAD_INPUT, result.output
    line = result.stderr.strip()
    assert line.startswith(f"error: --limit {limit}: {unmatched} matches no host of "), line
    assert line.endswith("name hosts or groups it has: group web, web1, web2"), line
    assert "Could not match supplied host pattern" not in result.output  # Ansible's own words stay out
    assert not (tmp_path / "state" / "runs").exists(), "no playbook may start"


def test_verify_refuses_such_a_limit_the_same_way(tmp_path: Path):
    result = invoke("verify", "-i", str(fleet_inventory(tmp_path)), "--limit", "nosuchhost")
    assert result.exit_code == ExitCode.BAD_INPUT, result.output
    assert result.stderr.startswith("error: --limit nosuchhost: nosuchhost matches no host of "), result.stderr


def test_a_limit_that_matches_is_left_to_ansible(tmp_path: Path):
    inv = fleet_inventory(tmp_path)
    for limit in ("web1", "web", "web*", "all:!web2", "web:!nosuchhost"):
        engine.check_limit(inv, limit)


def test_the_connect_timeout_is_a_whole_number_of_seconds_from_one(monkeypatch):
    assert engine.connect_timeout() == engine.DEFAULT_CONNECT_TIMEOUT
    result = invoke("facts", "--connect-timeout", "0")
    assert result.exit_code == ExitCode.BAD_INPUT
    assert result.stderr.startswith("error: --connect-timeout 0: give a whole number of seconds")
    monkeypatch.setattr(engine.ssh, "_connect_timeout", engine.DEFAULT_CONNECT_TIMEOUT)
    engine.set_connect_timeout(4)
    assert engine.connect_timeout() == 4


def test_an_option_of_the_wrong_type_is_refused_before_any_run(tmp_path: Path, monkeypatch):
    """The roles' argument specs would refuse it on each host after connecting: the same check here first."""
    with pytest.raises(
        BadInput, match=r"^-e plan_trials: 'many' is not a valid int \(.*\); see roles/plan/meta/argument_specs.yml$"
    ):
        options.parse_extra_vars(["plan_trials=many"])
    assert options.parse_extra_vars(["plan_trials=8", "serving_enabled=yes"]) == {"plan_trials": 8, "serving_enabled": True}
    monkeypatch.setenv("PROVISIONER_STATE_DIR", str(tmp_path / "state"))
    result = invoke("up", "-i", str(fleet_inventory(tmp_path)), "-e", "serving_enabled=maybe")
    assert result.exit_code == ExitCode.BAD_INPUT
    assert result.stderr.startswith("error: -e serving_enabled: 'maybe' is not a valid bool"), result.stderr
    assert not (tmp_path / "state" / "runs").exists(), "no playbook may start"

"""What the allocator role promises, checked on the target: jemalloc preloaded into the
services that opted in, and nowhere else."""

from __future__ import annotations

import json
import re
import shlex

import pytest

from provisioner.checks import as_root, role_constants, role_vars
from provisioner.constants import SERVING_TEMPLATE_UNIT

DROPIN_NAME, UNIT_DIR, LIBRARY_NAME = role_constants("allocator", "dropin_name", "unit_dir", "library_name")


@pytest.fixture()
def allocator(host):
    values = role_vars(host, "allocator")
    units = {s if s.endswith(".service") else f"{s}.service" for s in values["allocator_services"]}
    # The model server's worker template, where role serving deploys with jemalloc (through
    # this role's tasks: the allocator play keeps that drop-in).
    serving = role_vars(host, "serving")
    if serving["serving_jemalloc"] and (serving["serving_enabled"] or serving["serving_model_sources"]):
        units.add(SERVING_TEMPLATE_UNIT)
    values["units"] = sorted(units)
    values["originals"] = f"{role_vars(host, 'common')['common_state_dir']}/originals/allocator.json"
    return values


@pytest.fixture()
def library(host, allocator):
    """The real path of libjemalloc.so.2 as the installed package ships it for this host."""
    files = host.run(f"dpkg-query --listfiles {allocator['allocator_package']}").stdout.splitlines()
    found = [f for f in files if f.endswith(f"/{LIBRARY_NAME}")]
    assert found, f"{allocator['allocator_package']} ships no {LIBRARY_NAME}"
    return host.check_output(f"realpath -e {found[0]}")


def _opted_in(unit: str, units: list[str]) -> bool:
    """A unit opted in by name, or an instance (name@x.service) of an opted-in template."""
    return unit in units or re.sub(r"@[^@]*\.service$", "@.service", unit) in units


def _instances(host, units: list[str]) -> list[str]:
    """The units, each template (name@.service) replaced by its loaded instances."""
    out = [u for u in units if not u.endswith("@.service")]
    templates = [u for u in units if u.endswith("@.service")]
    if templates:
        patterns = " ".join(shlex.quote(t.replace("@.service", "@*.service")) for t in templates)
        listed = host.check_output(f"systemctl list-units --all --no-legend --plain {patterns}").splitlines()
        out += [line.split()[0] for line in listed if line.strip()]
    return sorted(out)


def _systemd(host) -> bool:
    return host.file("/run/systemd/system").is_directory


def _show(host, units, prop):
    """systemctl show -p PROP for several units: {unit: value}.  systemctl prints each unit's
    properties in its own order (not the order of -p), one blank line between units."""
    if not units:
        return {}
    out = host.check_output(f"systemctl show -p Id -p {prop} {' '.join(map(shlex.quote, units))}")
    values = {}
    for block in out.split("\n\n"):
        props = dict(line.split("=", 1) for line in block.splitlines() if "=" in line)
        if "Id" in props:
            values[props["Id"]] = props.get(prop, "")
    return values


def test_jemalloc_installed(host, allocator, library):
    assert host.package(allocator["allocator_package"]).is_installed
    assert host.file(library).is_file
    # The loader of this host's architecture preloads it (a library of another arch is refused).
    r = host.run(f"LD_PRELOAD={shlex.quote(library)} /bin/true")
    assert r.rc == 0 and "cannot be preloaded" not in r.stderr, r.stderr


def test_dropins_preload_jemalloc(host, allocator, library):
    if not allocator["units"]:
        pytest.skip("allocator_services is empty: no service opted in")
    for unit in allocator["units"]:
        f = host.file(f"{UNIT_DIR}/{unit}.d/{DROPIN_NAME}")
        assert f.exists, f"{unit}: drop-in {f.path} missing"
        assert f.user == "root" and f.mode == 0o644
        lines = f.content_string.splitlines()
        assert "[Service]" in lines
        assert f"Environment=LD_PRELOAD={library}" in lines
        conf = allocator["allocator_malloc_conf"]
        assert (f"Environment=MALLOC_CONF={conf}" in lines) == bool(conf), f"{unit}: MALLOC_CONF line vs {conf!r}"


def test_no_dropins_for_other_services(host, allocator):
    found = host.run(f"find {UNIT_DIR} -mindepth 2 -maxdepth 2 -name {DROPIN_NAME}").stdout.split()
    assert sorted(found) == sorted(f"{UNIT_DIR}/{u}.d/{DROPIN_NAME}" for u in allocator["units"])


def test_never_system_wide(host):
    preload = host.file("/etc/ld.so.preload")
    assert not (preload.exists and "jemalloc" in preload.content_string), "/etc/ld.so.preload loads jemalloc"
    hits = host.run(
        "grep -rlsE 'LD_PRELOAD|jemalloc' /etc/environment /etc/profile /etc/profile.d /etc/bash.bashrc "
        "/etc/security/pam_env.conf /etc/environment.d /etc/systemd/system.conf /etc/systemd/system.conf.d"
    ).stdout.split()
    assert hits == [], f"LD_PRELOAD/jemalloc set system-wide in {hits}"
    if _systemd(host):
        assert "LD_PRELOAD" not in host.check_output("systemctl show-environment")


def test_systemd_gives_ld_preload_only_to_opted_in_services(host, allocator, library):
    if not _systemd(host):
        pytest.skip("systemd is not PID 1 here")
    listed = host.check_output("systemctl list-units --type=service --all --no-legend --plain").splitlines()
    named = {u for u in allocator["units"] if not u.endswith("@.service")}  # templates show through their instances
    loaded = sorted({line.split()[0] for line in listed if line.strip()} | named)
    environments = _show(host, loaded, "Environment")
    preloaded = sorted(u for u, env in environments.items() if "LD_PRELOAD=" in env)
    assert all(_opted_in(u, allocator["units"]) for u in preloaded), (
        f"LD_PRELOAD set for {preloaded}, opted in: {allocator['units']}"
    )
    for unit in allocator["units"]:
        if unit.endswith("@.service"):  # a template: its instances carry it (checked above)
            continue
        assert f"LD_PRELOAD={library}" in environments[unit].split()


def test_running_services_load_jemalloc(host, allocator, library):
    if not _systemd(host) or not allocator["units"]:
        pytest.skip("no opted-in services under systemd here")
    pids = {u: int(p) for u, p in _show(host, _instances(host, allocator["units"]), "MainPID").items()}
    running = {u: p for u, p in pids.items() if p > 0}
    if not running:
        pytest.skip(f"none of {allocator['units']} is running")
    with as_root(host):
        for unit, pid in running.items():
            maps = host.file(f"/proc/{pid}/maps").content_string
            assert library in maps, f"{unit} (pid {pid}) has not loaded {library}: restart it"
            environ = host.file(f"/proc/{pid}/environ").content_string.split("\0")
            assert f"LD_PRELOAD={library}" in environ
            conf = allocator["allocator_malloc_conf"]
            if conf:
                assert f"MALLOC_CONF={conf}" in environ


def test_originals_recorded_for_undo(host, allocator):
    if not allocator["units"]:
        pytest.skip("allocator_services is empty: nothing to record")
    with as_root(host):
        f = host.file(allocator["originals"])
        assert f.exists, f"{allocator['originals']} missing: undo would not know what to remove"
        data = json.loads(f.content_string)
    expected = {f"{UNIT_DIR}/{u}.d/{DROPIN_NAME}" for u in allocator["units"]}
    assert expected <= set(data["created"])
    assert all(re.match(rf"^{re.escape(UNIT_DIR)}/.+\.d/{re.escape(DROPIN_NAME)}$", p) for p in data["created"])

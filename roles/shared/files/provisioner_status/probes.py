"""The probes: the live value of each kind of check, and how it compares with the expected one."""

from __future__ import annotations

import hashlib
import json
import os
import pwd
import re
import shlex
from typing import Any

from provisioner_status.common import (
    DOCTOR_TIMEOUT,
    DRIFTED,
    HUGEPAGE_KIB,
    NOT_APPLICABLE,
    OK,
    UNSET,
    parse_env,
    read,
    run,
    systemd_is_pid1,
    words,
)
from provisioner_status.kernel import (
    cpufreq_values,
    describe_md,
    device_uuid,
    parse_mdstat,
    parse_mountinfo,
    persisted_sysctl,
    recovering,
    sysctl_files,
    sysctl_key,
    thp_selected,
    tmpfiles_value,
)
from provisioner_status.sources import (
    _NAME,
    Source,
    default_environment,
    file_source,
    login_trace,
    manager_conf_files,
    parse_trace,
)

# ---------------------------------------------------------------- the probes

Reading = tuple[str | None, str, str]  # (live value, state, reason)


class Probes:
    """One instance per run: environments read once are shared by the checks that need them."""

    def __init__(self, root: str = "/") -> None:
        self.root = root
        self._login: dict[str, dict[str, str] | str] = {}
        self._service: dict[str, str] | str | None = None
        self._sysctl_files: list[str] | None = None
        self._doctor: dict[str, tuple[int, str, str]] = {}
        self._login_sources: dict[str, dict[str, tuple[str, int, str] | None]] = {}
        self._manager_files: list[str] | None = None
        # Every check of the run (measure_all sets it): a login shell is traced once for all
        # the variables its user's checks name.
        self.checks: list[dict[str, Any]] = []

    def path(self, p: str) -> str:
        return os.path.join(self.root, p.lstrip("/"))

    def measure(self, check: dict[str, Any]) -> Reading:
        probe = getattr(self, "probe_" + check["probe"])
        result: Reading = probe(check, str(check.get("expected", "")))
        return result

    # sysctl
    def probe_sysctl(self, check: dict[str, Any], expected: str) -> Reading:
        key = sysctl_key(check["key"])
        if self._sysctl_files is None:
            self._sysctl_files = sysctl_files(self.root)
        boot, source = persisted_sysctl(key, self._sysctl_files)
        readings, problems = [], []
        if check.get("live", False):
            raw = read(self.path("/proc/sys/" + key.replace(".", "/")))
            live = words(raw) if raw is not None else None
            readings.append(f"live {live if live is not None else '(missing)'}")
            if live != words(expected):
                problems.append(f"the running kernel has {live if live is not None else 'no ' + key}")
        readings.append(f"at boot {boot if boot is not None else '(not set)'}" + (f" ({source})" if source else ""))
        if boot != words(expected):
            problems.append(f"at boot {boot} from {source}" if boot is not None else f"no sysctl.d file sets {key}")
        if problems:
            return "; ".join(readings), DRIFTED, "; ".join(problems)
        return boot, OK, ""

    # THP
    def probe_thp(self, check: dict[str, Any], expected: str) -> Reading:
        path = check["path"]
        if check.get("live", True):
            raw = read(self.path(path))
            if raw is None:
                return None, NOT_APPLICABLE, f"not applicable: no {path} (a kernel without THP)"
            live = thp_selected(raw)
            return compare(live, expected, f"{path} selects {live}")
        persisted = check.get("persisted_file", "")
        text = read(self.path(persisted))
        if text is None:
            return None, DRIFTED, f"{persisted} is gone (THP is read-only here: the value is persisted for the boot)"
        value = tmpfiles_value(text, path)
        return compare(value, expected, f"{persisted} writes {value if value is not None else 'nothing'} to {path}")

    # login shell and service environments
    def probe_login_env(self, check: dict[str, Any], expected: str) -> Reading:
        user = check["user"]
        if user not in self._login:
            rc, out, err = run(["runuser", "-l", user, "-c", "env"])
            self._login[user] = parse_env(out) if rc == 0 else f"runuser -l {user} exited {rc}: {err.strip()[:200]}"
        env = self._login[user]
        if isinstance(env, str):
            return None, DRIFTED, env
        live = env.get(check["var"], UNSET)
        return compare(
            live,
            expected,
            f"a login shell of {user} has {check['var']}={live}"
            if live != UNSET
            else f"a login shell of {user} has no {check['var']}",
        )

    def probe_service_env(self, check: dict[str, Any], expected: str) -> Reading:
        if not systemd_is_pid1(self.root):
            return None, NOT_APPLICABLE, "not applicable: systemd is not PID 1"
        if self._service is None:
            argv = ["systemd-run", "--wait", "--pipe", "--quiet", "--collect", "/usr/bin/env"]
            rc, out, err = run(argv)
            self._service = parse_env(out) if rc == 0 else f"systemd-run exited {rc}: {err.strip()[:200]}"
        if isinstance(self._service, str):
            return None, DRIFTED, self._service
        live = self._service.get(check["var"], UNSET)
        return compare(
            live, expected, f"a service has {check['var']}={live}" if live != UNSET else f"a service has no {check['var']}"
        )

    # where a drifted value comes from
    def source(self, check: dict[str, Any], live: str | None) -> Source | None:
        """The file and line that set a drifted variable's live value (login shells, services);
        None when unknown or for other probes. Never fails the run: a source is a hint."""
        try:
            if check["probe"] == "login_env":
                return self._login_source(check["user"], check["var"])
            if check["probe"] == "service_env":
                return self._service_source(check["var"], live)
        except (OSError, KeyError, ValueError):
            return None
        return None

    def _login_source(self, user: str, var: str) -> Source | None:
        if var not in self._login_sources.get(user, {}):
            names = sorted({c["var"] for c in self.checks if c.get("probe") == "login_env" and c.get("user") == user} | {var})
            names = [n for n in names if _NAME.match(n)]
            entry = pwd.getpwnam(user)
            argv, env = login_trace(user, names, entry.pw_uid, entry.pw_dir)
            _, out, err = run(argv, env=env)
            self._login_sources[user] = parse_trace(err + "\n" + out, names)
        found = self._login_sources[user].get(var)
        return file_source(found[0], found[1], self.root) if found else None

    def _service_source(self, var: str, live: str | None) -> Source | None:
        if self._manager_files is None:
            self._manager_files = manager_conf_files(self.root)
        value, path, line = default_environment(var, self._manager_files, self.root)
        live_value = None if live in (None, UNSET) else live
        if path is not None and line is not None and value == live_value:
            return file_source(path, line, self.root)
        if live_value is not None and value != live_value:
            return {"file": None, "line": None, "how": "systemctl set-environment", "managed_by_provisioner": False}
        return None

    # tuned
    def probe_tuned(self, check: dict[str, Any], expected: str) -> Reading:
        profile_dir = check.get("profile_dir")
        if profile_dir and not os.path.isdir(self.path(profile_dir)):
            return None, DRIFTED, f"the profile's directory {profile_dir} is gone"
        if not systemd_is_pid1(self.root):
            return None, NOT_APPLICABLE, "not applicable: systemd is not PID 1 (tuned is not driven here)"
        rc, out, err = run(["tuned-adm", "active"])
        m = re.search(r"^Current active profile:\s*(\S+)", out, re.M)
        if m:
            live: str | None = m.group(1)
            how = "tuned-adm active"
        elif rc == 127:
            live, how = (read(self.path("/etc/tuned/active_profile")) or "").strip() or None, "/etc/tuned/active_profile"
        else:
            detail = (out + err).strip().splitlines()
            return "none", DRIFTED, "tuned-adm active: " + (detail[0] if detail else f"exit {rc}")
        return compare(live, expected, f"{how}: {live if live else 'no profile'}")

    # cpufreq
    def probe_governor(self, check: dict[str, Any], expected: str) -> Reading:
        return self._cpufreq("scaling_governor", check, expected)

    def probe_epp(self, check: dict[str, Any], expected: str) -> Reading:
        return self._cpufreq("energy_performance_preference", check, expected)

    def _cpufreq(self, name: str, check: dict[str, Any], expected: str) -> Reading:
        if not os.path.isdir(self.path("/sys/devices/system/cpu/cpu0/cpufreq")):
            return None, NOT_APPLICABLE, "not applicable: no cpufreq driver"
        values = cpufreq_values(name, self.root)
        if not values:
            return None, NOT_APPLICABLE, f"not applicable: the cpufreq driver has no {name}"
        if not check.get("live", True):
            return None, NOT_APPLICABLE, f"not applicable: {name} is not set live here (read-only or not offered)"
        seen = sorted(set(values.values()))
        live = seen[0] if len(seen) == 1 else ", ".join(f"{p}={v}" for p, v in values.items())
        wrong = [p for p, v in values.items() if v != expected]
        if wrong:
            return live, DRIFTED, f"{name} differs on {len(wrong)} of {len(values)} cpufreq policies ({', '.join(wrong)})"
        return live, OK, ""

    # hugepages
    def probe_hugepages(self, check: dict[str, Any], expected: str) -> Reading:
        size = check["size"]
        if size == "2M" and not check.get("live", True):
            if self._sysctl_files is None:
                self._sysctl_files = sysctl_files(self.root)
            boot, source = persisted_sysctl("vm.nr_hugepages", self._sysctl_files)
            return compare(
                boot,
                expected,
                f"at boot vm.nr_hugepages={boot} from {source}"
                if source
                else "no sysctl.d file sets vm.nr_hugepages (vm.* is read-only here: persisted for the boot)",
            )
        raw = read(self.path(f"/sys/kernel/mm/hugepages/hugepages-{HUGEPAGE_KIB[size]}kB/nr_hugepages"))
        if raw is None:
            return None, NOT_APPLICABLE, f"not applicable: the kernel offers no {size} pages"
        live = raw.strip()
        if size == "1G" and live != expected:
            want = f"hugepagesz=1G hugepages={expected}"
            cmdline = f" {(read(self.path('/proc/cmdline')) or '').strip()} "
            if f" {want} " not in cmdline:
                return live, NOT_APPLICABLE, f"reboot pending: the running kernel booted without '{want}'"
        return compare(live, expected, f"{live} {size} pages reserved")

    # the data mount and its array
    def probe_mount(self, check: dict[str, Any], expected: str) -> Reading:
        path = check["path"].rstrip("/") or "/"
        mounts = [m for m in parse_mountinfo(read(self.path("/proc/self/mountinfo")) or "") if m["mountpoint"] == path]
        if not mounts:
            return "not mounted", DRIFTED, f"nothing is mounted at {path}"
        top = mounts[-1]
        live = top["fstype"]
        problems, note = [], ""
        if check.get("fstype") and top["fstype"] != check["fstype"]:
            problems.append(f"{path} is {top['fstype']}, not {check['fstype']}")
        if check.get("uuid"):
            found = self._mount_uuid(top, check["uuid"])
            live += f" UUID={found}" if found else " UUID unknown"
            if found and found != check["uuid"]:
                problems.append(f"{path} has UUID {found}, not {check['uuid']}")
            elif not found:
                # No udev links and no blkid here (a container): no evidence either way.
                note = f"the UUID of {top['source']} cannot be read here: only the filesystem type was checked"
        live += f" ({top['source']})"
        return (live, DRIFTED, "; ".join(problems)) if problems else (live, OK, note)

    def _mount_uuid(self, mount: dict[str, str], expected: str) -> str | None:
        # A mounted btrfs (one filesystem over several drives) is /sys/fs/btrfs/UUID.
        if mount["fstype"] == "btrfs" and os.path.isdir(self.path(f"/sys/fs/btrfs/{expected}")):
            return expected
        return device_uuid(mount["source"])

    def probe_md(self, check: dict[str, Any], expected: str) -> Reading:
        text = read(self.path("/proc/mdstat"))
        if text is None:
            return None, NOT_APPLICABLE, "not applicable: no md driver"
        device = check["device"]
        link = self.path(device)
        if not os.path.exists(link):
            return "absent", DRIFTED, f"no {device}: the array is not assembled"
        name = os.path.basename(os.path.realpath(link))
        array = parse_mdstat(text).get(name)
        if array is None:
            return "absent", DRIFTED, f"{device} ({name}) is not in /proc/mdstat"
        members = [self._member_name(str(m)) for m in check.get("members", [])]
        live = describe_md(name, array, [m for m in members if m])
        if not array["active"]:
            return live, DRIFTED, f"{device} is {array['state']}"
        if array["degraded"] and not recovering(array):
            return live, DRIFTED, f"{device} is degraded: " + live.split(" degraded: ", 1)[-1]
        return live, OK, ""

    def _member_name(self, member: str) -> str:
        """A declared member as /proc/mdstat names it: a /dev/... path (a stable id) by the kernel name
        it points to, the path itself when it is not on the host (a lost drive, named so); a
        serial:/wwn: id is not resolved here ("" : a missing one is counted, not named)."""
        if member.startswith("/dev/"):
            path = self.path(member)
            return os.path.basename(os.path.realpath(path)) if os.path.exists(path) else member
        return "" if member.startswith(("serial:", "wwn:")) else member

    # the ML stack's doctor
    # systemd units: "active enabled" (or whatever states the role expects)
    def probe_unit(self, check: dict[str, Any], expected: str) -> Reading:
        if not systemd_is_pid1(self.root):
            return None, NOT_APPLICABLE, "not applicable: systemd is not PID 1"
        unit = check["unit"]
        _, active, _ = run(["systemctl", "is-active", unit])
        _, enabled, _ = run(["systemctl", "is-enabled", unit])
        live = f"{active.strip() or 'unknown'} {enabled.strip() or 'unknown'}"
        return compare(live, expected, f"{unit} is {live}")

    # a symlink the role points (the ML environment at its live generation): its target
    def probe_link(self, check: dict[str, Any], expected: str) -> Reading:
        path = check["path"]
        try:
            live = os.readlink(self.path(path))
        except OSError:
            return None, DRIFTED, f"{path} is not a symlink"
        return compare(live, expected, check.get("detail") or f"{path} points at {live}")

    # a file the role writes: its content by SHA-256
    def probe_file(self, check: dict[str, Any], expected: str) -> Reading:
        path = check["path"]
        try:
            with open(self.path(path), "rb") as f:
                digest = hashlib.sha256(f.read()).hexdigest()
        except FileNotFoundError:
            return None, DRIFTED, f"{path} is gone"
        except OSError as exc:
            return None, DRIFTED, f"cannot read {path}: {exc.strerror}"
        return compare(f"sha256:{digest}", expected, f"{path} was changed since the role wrote it")

    def probe_doctor(self, check: dict[str, Any], expected: str) -> Reading:
        command = check.get("command", "/opt/mlstack/bin/mlstack-doctor")
        if not os.path.isfile(self.path(command)):
            return None, DRIFTED, f"{command} is gone"
        user = check.get("user")
        argv = [command, "--json"]
        if user:
            argv = ["runuser", "-l", user, "-c", shlex.join(argv)]
        key = " ".join(argv)
        if key not in self._doctor:
            self._doctor[key] = run(argv, timeout=DOCTOR_TIMEOUT)
        rc, out, err = self._doctor[key]
        try:
            result = json.loads(out)
        except ValueError:
            return None, DRIFTED, f"{command} --json exited {rc}: {(err or out).strip()[-300:]}"
        return doctor_reading(result)


def doctor_reading(result: dict[str, Any]) -> Reading:
    """pass/fail from the doctor's JSON; the BLAS kernel and OpenMP runtime as the live value."""
    checks = result.get("checks", [])
    shown = "; ".join(f"{c['name']}: {c.get('detail', '')}" for c in checks if c.get("name") in ("blas-kernel", "openmp"))
    failed = [f"{c['name']}: {c.get('detail', '')}" for c in checks if c.get("status") == "fail"]
    if result.get("ok") and not failed:
        return "pass" + (f" ({shown})" if shown else ""), OK, ""
    return "fail", DRIFTED, "; ".join(failed) or "the doctor failed"


def compare(live: str | None, expected: str, detail: str) -> Reading:
    """ok when the live value is the expected one, else drifted with what was found."""
    if live is not None and words(str(live)) == words(expected):
        return live, OK, ""
    return live, DRIFTED, detail

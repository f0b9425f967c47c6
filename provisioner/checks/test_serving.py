"""What role serving promises, checked on the target: the socket and every worker unit up, the
serving socket on its one address and the admin ports on 127.0.0.1 only, the hardening in
place, each worker process inside its CPU slice with its thread variables equal to the slice,
every worker ready on its admin port, the systemd-analyze security exposure at most its
measured ceiling, and the registry and config owned as the role writes them."""

from __future__ import annotations

import json
import re
import shlex

import pytest

from provisioner.checks import as_root, role_constants, role_vars

SOCKET, SLICE, PREFIX, THREAD_VARIABLES = role_constants(
    "serving", "socket_unit", "slice_unit", "instance_prefix", "thread_variables"
)
LIB_DIR, SERVER_MODULES = role_constants("serving", "lib_dir", "server_modules")
CONFIG = "/etc/provisioner/serving/serving.json"
# systemd-analyze security's exposure for provisioner-serve@0.service, measured on a lab
# server (Debian 12, systemd 252): the units must stay at or below it ("OK" is 2.0 .. 4.9).
EXPOSURE_CEILING = 2.5
# The worker template's yes/no hardening options, each "yes" on the running unit.
HARDENED = (
    "PrivateTmp",
    "PrivateDevices",
    "NoNewPrivileges",
    "ProtectKernelTunables",
    "ProtectKernelModules",
    "ProtectControlGroups",
    "RestrictRealtime",
    "LockPersonality",
)


@pytest.fixture()
def serving(host):
    values = role_vars(host, "serving")
    if not (values["serving_enabled"] or values["serving_model_sources"]):
        pytest.skip("serving_enabled is false and serving_model_sources is empty: the role changed nothing here")
    with as_root(host):
        config = json.loads(host.file(CONFIG).content_string)
    values["config"] = config
    values["instances"] = [f"{PREFIX}{w['index']}.service" for w in config["workers"]]
    return values


def _show(host, unit: str, *props: str) -> dict[str, str]:
    out = host.check_output(f"systemctl show {shlex.quote(unit)} " + " ".join(f"-p {p}" for p in props))
    return dict(line.split("=", 1) for line in out.splitlines() if "=" in line)


def _http(host, method: str, url: str, body: dict | None = None) -> tuple[int, dict]:
    """One request from inside the server, as a local client would send it."""
    code = (
        "import json, sys, urllib.request, urllib.error\n"
        f"req = urllib.request.Request({url!r}, method={method!r}, "
        f"data={json.dumps(body).encode() if body is not None else None!r}, "
        "headers={'Content-Type': 'application/json'})\n"
        "try:\n"
        "    r = urllib.request.urlopen(req, timeout=30); print(r.status); print(r.read().decode())\n"
        "except urllib.error.HTTPError as e:\n"
        "    print(e.code); print(e.read().decode())\n"
    )
    out = host.check_output(f"python3 -c {shlex.quote(code)}")
    status, _, text = out.partition("\n")
    return int(status), json.loads(text)


def test_the_socket_and_every_worker_are_active_and_enabled(host, serving):
    assert serving["config"]["workers"] and len(serving["instances"]) == serving["serving_workers"]
    for unit in [SOCKET, *serving["instances"]]:
        props = _show(host, unit, "ActiveState", "UnitFileState")
        assert props == {"ActiveState": "active", "UnitFileState": "enabled"}, f"{unit}: {props}"
    # No worker above serving_workers.
    listed = host.check_output(f"systemctl list-units --all --plain --no-legend '{PREFIX}*.service'")
    assert sorted(line.split()[0] for line in listed.splitlines() if line.strip()) == sorted(serving["instances"])


def test_the_serving_socket_and_the_admin_ports_listen_on_loopback_only(host, serving):
    config = serving["config"]
    ports = {config["port"]} | {config["admin_port_base"] + w["index"] for w in config["workers"]}
    with as_root(host):
        out = host.check_output("ss -Hltn")
    bound: dict[int, set[str]] = {}
    for line in out.splitlines():
        local = line.split()[3]
        address, _, port = local.rpartition(":")
        bound.setdefault(int(port), set()).add(address.strip("[]"))
    for port in ports:
        # The serving socket on its one address (127.0.0.1 unless serving_allow_nonlocal), the
        # admin ports always on loopback.
        wanted = {config["listen"]} if port == config["port"] else {"127.0.0.1"}
        assert bound.get(port) == wanted, f"port {port} is bound to {bound.get(port)}: ss says\n{out}"


def test_the_worker_template_is_hardened(host, serving):
    props = _show(
        host,
        serving["instances"][0],
        "Type",
        "User",
        "Restart",
        "Slice",
        "ProtectSystem",
        "ProtectHome",
        *HARDENED,
        "CapabilityBoundingSet",
        "MemoryDenyWriteExecute",
        "MemoryMax",
        "RestrictAddressFamilies",
        "ReadOnlyPaths",
    )
    assert props["Type"] == "notify"
    assert props["User"] == serving["serving_user"]
    assert props["Restart"] == "on-failure"
    assert props["Slice"] == SLICE
    assert props["ProtectSystem"] == "strict" and props["ProtectHome"] == "yes"
    for yes in HARDENED:
        assert props[yes] == "yes", f"{yes}={props[yes]}"
    assert props["CapabilityBoundingSet"] == "", props["CapabilityBoundingSet"]
    assert props["MemoryDenyWriteExecute"] == "no"  # JIT compilers need it off
    assert set(props["RestrictAddressFamilies"].split()) == {"AF_INET", "AF_INET6", "AF_UNIX"}
    assert serving["config"]["registry"] in props["ReadOnlyPaths"].split()
    # The budgets: each worker's share of the slice's, the cache inside the worker's; the
    # inventory's or the plan's values where they are known here (the fallback reads facts).
    worker_max = int(props["MemoryMax"])
    slice_max = int(_show(host, SLICE, "MemoryMax")["MemoryMax"])
    mem_total = int(host.file("/proc/meminfo").content_string.split()[1]) * 1024
    assert serving["config"]["cache_budget_bytes"] < worker_max
    assert worker_max * len(serving["instances"]) <= slice_max <= mem_total
    for option, live in (("serving_worker_memory_bytes", worker_max), ("serving_memory_budget_bytes", slice_max)):
        if isinstance(serving.get(option), int):
            assert live == serving[option], option


def _main_pid(host, unit: str) -> int:
    pid = int(_show(host, unit, "MainPID")["MainPID"])
    assert pid > 0, f"{unit} has no main process"
    return pid


def test_every_worker_runs_inside_its_slice_with_threads_equal_to_it(host, serving):
    user = serving["serving_user"]
    for worker, unit in zip(serving["config"]["workers"], serving["instances"], strict=True):
        pid = _main_pid(host, unit)
        with as_root(host):
            environ = dict(
                item.split("=", 1)
                for item in host.check_output(f"tr '\\0' '\\n' < /proc/{pid}/environ").splitlines()
                if "=" in item
            )
            status = dict(line.split(":", 1) for line in host.file(f"/proc/{pid}/status").content_string.splitlines())
        threads = worker["threads"]
        assert threads == serving["serving_threads_per_worker"]
        for var in THREAD_VARIABLES:
            assert environ.get(var) == str(threads), f"{unit}: {var}={environ.get(var)}, its slice has {threads}"
        allowed = _cpu_list(status["Cpus_allowed_list"].strip())
        assert allowed == sorted(worker["cpus"]) == sorted(serving["serving_worker_cpus"][worker["index"]]), unit
        assert _show(host, unit, "CPUAffinity")["CPUAffinity"].split() == [str(c) for c in worker["cpus"]]
        assert int(status["Uid"].split()[0]) == host.user(user).uid, f"{unit} does not run as {user}"
        if serving["serving_jemalloc"]:
            assert "libjemalloc.so" in environ.get("LD_PRELOAD", ""), f"{unit}: LD_PRELOAD={environ.get('LD_PRELOAD')}"


def _cpu_list(text: str) -> list[int]:
    cpus: list[int] = []
    for part in text.split(","):
        lo, _, hi = part.partition("-")
        cpus.extend(range(int(lo), int(hi or lo) + 1))
    return cpus


def test_every_worker_answers_on_its_admin_port_with_its_slice(host, serving):
    config = serving["config"]
    for worker in config["workers"]:
        base = f"http://127.0.0.1:{config['admin_port_base'] + worker['index']}"
        assert _http(host, "GET", f"{base}/healthz") == (200, {"status": "ok", "worker": worker["index"]})
        assert _http(host, "GET", f"{base}/readyz")[0] == 200
        status, models = _http(host, "GET", f"{base}/v1/models")
        assert status == 200
        assert (models["worker"], models["threads"], sorted(models["cpus"])) == (
            worker["index"],
            worker["threads"],
            sorted(worker["cpus"]),
        )
        loaded = {(m["name"], m["version"]) for m in models["models"] if m["loaded"]}
        if config["models"] != "all":
            assert {(m["name"], m["version"]) for m in config["models"]} <= loaded, f"worker {worker['index']}: {loaded}"
        assert models["cache_budget_bytes"] == config["cache_budget_bytes"]
        assert (models["cache_bytes"] > 0) == bool(loaded), models


def test_the_units_exposure_is_recorded_and_at_most_the_ceiling(host, serving):
    out = host.check_output(f"systemd-analyze security --no-pager {serving['instances'][0]}")
    match = re.search(r"Overall exposure level for \S+: ([0-9.]+) (\w+)", out)
    assert match, out[-2000:]
    score, verdict = float(match.group(1)), match.group(2)
    print(f"systemd-analyze security {serving['instances'][0]}: {score} {verdict}")
    assert score <= EXPOSURE_CEILING, out[-4000:]


def test_the_registry_holds_the_copied_versions_and_the_config_is_private(host, serving):
    registry = serving["config"]["registry"]
    for source in serving["serving_model_sources"]:
        meta = host.file(f"{registry}/{source['name']}/{source['version']}/metadata.json")
        assert meta.exists and meta.user == "root" and meta.mode == 0o644
    config = host.file(CONFIG)
    assert (config.user, config.group, config.mode) == ("root", serving["serving_user"], 0o640)
    assert serving["config"]["models"] == ("all" if not serving["serving_models"] else serving["serving_models"])
    assert serving["config"]["listen"] == serving["serving_listen"]


def test_the_server_and_its_parts_are_installed_beside_it(host, serving):
    # The server imports its parts (provisioner_serve_*.py) from its own directory.
    for name in ["provisioner_serve.py", *SERVER_MODULES]:
        part = host.file(f"{LIB_DIR}/{name}")
        assert part.exists and (part.user, part.group, part.mode) == ("root", "root", 0o644), name

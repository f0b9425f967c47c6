"""Role allocator's option checks, run for real with ansible-playbook on localhost (the
preflight reads options only): a jemalloc option string passes, one with a space, a quote or
a backslash is refused naming the option."""

from __future__ import annotations

import sys
from pathlib import Path

import plugin_code
import pytest
from playbook_cases import local_env, local_host, run_cases

ROOT = Path(__file__).resolve().parents[2]


# All cases in one ansible-playbook run (playbook_cases): one host per case, its variables the
# case's input.
CASES = [("background_thread:true,dirty_decay_ms:10000", False), ("a b", True), ('a"b', True), ("a\\b", True)]
HOSTS = {f"conf{i}": conf for i, (conf, _) in enumerate(CASES)}
SAYS = "allocator_malloc_conf must be one jemalloc option string"


@pytest.fixture(scope="module")
def preflight_run(tmp_path_factory):
    play = [{"name": "Preflight", "hosts": "all", "gather_facts": False,
             "tasks": [{"ansible.builtin.include_role": {"name": "allocator", "tasks_from": "preflight"}}]}]
    env = local_env(ANSIBLE_ROLES_PATH=str(ROOT / "roles"), ANSIBLE_FILTER_PLUGINS=str(plugin_code.PLUGINS / "filter"),
                    ANSIBLE_INVENTORY_UNPARSED_WARNING="false", ANSIBLE_PYTHON_INTERPRETER=sys.executable)
    hosts = {h: local_host({"allocator_malloc_conf": conf}) for h, conf in HOSTS.items()}
    return run_cases(tmp_path_factory, "allocator-preflight", play, hosts, env=lambda workdir: env)


def test_a_run_with_a_refused_option_fails(preflight_run):
    assert preflight_run.returncode == 2, preflight_run.tail()


@pytest.mark.parametrize(("host", "conf", "refused"), [(h, *case) for h, case in zip(HOSTS, CASES, strict=True)],
                         ids=list(HOSTS))
def test_malloc_conf_is_one_option_string(preflight_run, host, conf, refused):
    stats = preflight_run.stats(host)
    assert (stats["failures"] + stats["unreachable"] != 0) == refused, preflight_run.tail()
    said = [result["msg"] for _, result in preflight_run.results(host) if SAYS in str(result.get("msg", ""))]
    assert bool(said) == refused, preflight_run.tail()
    if refused:
        assert f"(got {conf})" in said[0]

"""Mitogen's linear strategy (PROVISIONER_STRATEGY=mitogen) without Mitogen's CPU pinning, and
with Jinja's compiled code and plugin tables shared by the workers it forks.

Mitogen pins its multiplexer to CPU 0 and its workers, and every process they start, to the
CPUs after it. A process started on the control node inherits that mask: a lab server booted
by a task, or a workload or fact gathering over a local connection, would see one CPU of two
(OpenBLAS then runs one thread, ml-env counts one core). provisioner measures and plans CPUs,
so the pinning is switched off before the strategy starts any process; the rest is
Mitogen's own mitogen_linear.

The strategy runs in ansible-playbook's own process, before every fork of a task's worker:
there it installs the compiled-code cache of _template_cache.py (workers then hand each other
the code of every template and condition they compile, instead of compiling it again per
task) and fills the filter and test plugin tables once, which each worker inherits.
PROVISIONER_TEMPLATE_CACHE=off leaves both to Ansible as before (to measure, or to rule them out).

It also makes --accept-new-host-keys work under Mitogen (_host_keys.py says how) and gives the
connection timeout ssh's meaning (_connect_timeout.py) and leaves ssh's compression off
(_compression.py), in the same process before the forks.
"""

from __future__ import annotations

import importlib.util
import os
import sys
from pathlib import Path

import ansible_mitogen.affinity

# The base Policy assigns nothing: every process keeps the CPUs it was started with.
ansible_mitogen.affinity.policy = ansible_mitogen.affinity.Policy()

import ansible_mitogen.connection  # noqa: E402
import ansible_mitogen.loaders  # noqa: E402  (after the policy is replaced)
import ansible_mitogen.mixins  # noqa: E402
import ansible_mitogen.strategy  # noqa: E402


def _load_neighbour(stem: str):
    # Ansible loads this file by path, not as a package: its neighbours are loaded the same way.
    name = f"provisioner_strategy{stem}"
    if name not in sys.modules:
        spec = importlib.util.spec_from_file_location(name, Path(__file__).with_name(f"{stem}.py"))
        assert spec is not None and spec.loader is not None
        module = importlib.util.module_from_spec(spec)
        sys.modules[name] = module
        spec.loader.exec_module(module)
    return sys.modules[name]


template_cache = _load_neighbour("_template_cache")
_host_keys = _load_neighbour("_host_keys")
_host_keys.install(ansible_mitogen.connection)
# The connection timeout bounds ssh's answer, as under Ansible's ssh connection, not the whole start.
_host_keys.wrap_methods(ansible_mitogen.connection, "provisioner_connect_timeout", _load_neighbour("_connect_timeout").adjust)
# No ssh compression of what is compressed already (wheels, zip archives), as under Ansible's ssh connection.
_host_keys.wrap_methods(
    ansible_mitogen.connection,
    "provisioner_uncompressed",
    _load_neighbour("_compression").uncompressed,
    with_spec=True,
)
# A host that does not answer is reported after one connection timeout, not one per Python name.
_load_neighbour("_discovery").install(ansible_mitogen.mixins)

Base = ansible_mitogen.loaders.strategy_loader.get("linear", class_only=True)


WARM = os.environ.get("PROVISIONER_TEMPLATE_CACHE", "on") != "off"


class StrategyModule(ansible_mitogen.strategy.StrategyMixin, Base):  # type: ignore[misc,valid-type]
    def run(self, iterator, play_context, result=0):
        if WARM:
            template_cache.install()
            template_cache.share()
        return super().run(iterator, play_context, result)

    def _queue_task(self, host, task, task_vars, play_context):
        if WARM:
            # Right before the fork: a plugin directory added since (a role's) empties the tables.
            template_cache.warm_plugins()
        return super()._queue_task(host, task, task_vars, play_context)

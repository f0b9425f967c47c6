"""Mitogen's linear strategy (PROVISIONER_STRATEGY=mitogen) without Mitogen's CPU pinning.

Mitogen pins its multiplexer to CPU 0 and its workers, and every process they start, to the
CPUs after it. A process started on the control node inherits that mask: a lab server booted
by a task, or a workload or fact gathering over a local connection, would see one CPU of two
(OpenBLAS then runs one thread, ml-env counts one core). provisioner measures and plans CPUs,
so the pinning is switched off before the strategy starts any process; the rest is
Mitogen's own mitogen_linear.
"""

from __future__ import annotations

import ansible_mitogen.affinity

# The base Policy assigns nothing: every process keeps the CPUs it was started with.
ansible_mitogen.affinity.policy = ansible_mitogen.affinity.Policy()

import ansible_mitogen.loaders  # noqa: E402  (after the policy is replaced)
import ansible_mitogen.strategy  # noqa: E402

Base = ansible_mitogen.loaders.strategy_loader.get("linear", class_only=True)


class StrategyModule(ansible_mitogen.strategy.StrategyMixin, Base):  # type: ignore[misc,valid-type]
    pass

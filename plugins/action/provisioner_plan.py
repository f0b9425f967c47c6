# Copyright: provisioner contributors
# Apache License 2.0 (see pyproject.toml)
"""Action plugin: derive the tuning plan on the controller.

Reads the ``provisioner_hardware`` fact of the host (set by the provisioner_facts module), takes
the ``plan_*`` options from its task arguments, calls ``provisioner.plan.derive_plan`` and sets
the ``provisioner_plan`` fact to ``Plan.to_dict()``.  A ``PlanError`` fails the task with its
one-line reason.  Nothing runs on the target, so it behaves the same in check mode.
"""

from __future__ import annotations

DOCUMENTATION = r"""
---
module: provisioner_plan
short_description: Derive the tuning plan from the hardware facts (controller side)
description:
  - Calls C(provisioner.plan.derive_plan) with the host's C(provisioner_hardware) fact and the
    C(plan_*) options given as task arguments, and sets the C(provisioner_plan) fact.
  - Refuses C(plan_*) variables it does not know (typos), in the arguments and among the host's variables.
options:
  facts:
    description: Hardware facts to use instead of the host's C(provisioner_hardware) fact.
    type: dict
  plan_trials:
    description: Parallel trials; null means one per physical core.
    type: int
  plan_allow_oversubscription:
    description: Allow more trials, Polars threads, joblib workers or DataLoader workers than physical cores.
    type: bool
  plan_thp:
    description: Transparent huge pages mode.
    type: str
    choices: [madvise, always, never]
  plan_thp_defrag:
    description: Transparent huge pages defrag policy.
    type: str
    choices: [madvise, always, defer, defer+madvise, never]
  plan_hugepages_size:
    description: Explicit hugepage size, or null for none.
    type: str
    choices: [2M, 1G]
  plan_hugepages_count:
    description: Explicit hugepages to reserve.
    type: int
  plan_hugepages_share:
    description: Share of RAM to reserve as explicit hugepages (0 to 0.9).
    type: float
  plan_tuned_profile:
    description: tuned profile.
    type: str
    choices: [throughput-performance, hpc-compute, latency-performance]
  plan_data_mountpoint:
    description: Where the data array would be mounted.
    type: path
  plan_storage_level:
    description: RAID level of the data array proposal.
    type: str
    choices: [raid0, raid1, raid10, single]
  plan_storage_backend:
    description: mdadm (with XFS) or btrfs.
    type: str
    choices: [mdadm, btrfs]
  plan_storage_devices:
    description: Drives to use instead of every unused NVMe drive (still refused when in use).
    type: list
    elements: str
  plan_serving_workers:
    description: Model-server workers; null derives them from the physical cores.
    type: int
  plan_serving_threads_per_worker:
    description: Threads per model-server worker; null derives them from the physical cores.
    type: int
  plan_serving_memory_share:
    description: Share of the RAM after hugepages for the model server, split over its workers.
    type: float
  plan_serving_allocator:
    description: The model server's allocator, glibc or jemalloc (preloaded through role allocator); null is glibc.
    type: str
    choices: [glibc, jemalloc]
  plan_dataloader_workers:
    description: DataLoader workers of one training job; null derives them from the physical cores.
    type: int
  plan_polars_threads:
    description: Polars' thread pool of one job; null is threads_per_job. Above the physical cores only with plan_allow_oversubscription.
    type: int
  plan_joblib_workers:
    description: joblib/loky workers of one job; null is one per physical core. Above the physical cores only with plan_allow_oversubscription.
    type: int
  plan_arrow_io_threads:
    description: Arrow's IO pool of one job (ARROW_IO_THREADS); null is Arrow's default, 8. Not bounded by the cores (IO threads wait on the drive).
    type: int
  plan_tf_inter_op_threads:
    description: TensorFlow's inter-op pool of one job (TF_NUM_INTEROP_THREADS); null is one per socket. Above the physical cores only with plan_allow_oversubscription.
    type: int
  plan_tuned:
    description:
      - Plan value -> evidence, written by C(provisioner tune --write).
      - 'That setting''s reason then starts with "tuned: EVIDENCE; ".'
      - A name that is no value of the plan is refused.
    type: dict
  plan_feature_matrix_features:
    description: Features of the largest float32 feature matrix sized for the RAM.
    type: int
  plan_feature_matrix_rows:
    description: Rows of the feature matrix; null is the most that fit, more than fit is refused.
    type: int
  plan_ray_object_store_share:
    description: Share of the RAM after hugepages for a Ray node's object store.
    type: float
author:
  - provisioner contributors
"""

from ansible.errors import AnsibleError
from ansible.plugins.action import ActionBase

try:  # the provisioner package, installed on the control node (galaxy.yml)
    from provisioner.plan import PlanError, PlanOptions, derive_plan
except ImportError as exc:
    raise AnsibleError(f"provisioner_plan: pip install provisioner on the control node ({exc})") from exc


def _plain(value):
    """Strip Ansible's tagged/lazy containers down to plain Python values."""
    if isinstance(value, dict):
        return {str(k): _plain(v) for k, v in value.items()}
    if isinstance(value, (list, tuple)):
        return [_plain(v) for v in value]
    if isinstance(value, bool) or value is None:
        return value
    if isinstance(value, int):
        return int(value)
    if isinstance(value, float):
        return float(value)
    if isinstance(value, str):
        return str(value)
    return value


class ActionModule(ActionBase):
    # Runs on the controller only (ActionBase's defaults: no file transfer, check mode, no async).
    _requires_connection = False

    def run(self, tmp=None, task_vars=None):
        task_vars = task_vars or {}
        result = super().run(tmp, task_vars)
        result["changed"] = False

        args = _plain(dict(self._task.args))
        facts = args.pop("facts", None)
        if facts is None:
            facts = (task_vars.get("ansible_facts") or {}).get("provisioner_hardware")
        if facts is None:
            facts = task_vars.get("provisioner_hardware")
        if facts is None:
            result.update(failed=True, msg="no provisioner_hardware facts for this host: run the provisioner_facts module first (role plan)")
            return result

        not_plan = sorted(k for k in args if not k.startswith("plan_"))
        if not_plan:
            result.update(failed=True, msg=f"provisioner_plan takes plan_* options and facts, not: {', '.join(not_plan)}")
            return result
        # A typo among the host's variables (plan_trails: 8) would otherwise be silently ignored.
        known = set(PlanOptions.known_vars())
        typos = sorted(k for k in task_vars if isinstance(k, str) and k.startswith("plan_") and k not in known)
        try:
            if typos:
                PlanOptions.from_vars(dict.fromkeys(typos))  # raises, naming them and the known ones
            options = PlanOptions.from_vars(args)
            plan = derive_plan(_plain(facts), options)
        except PlanError as exc:
            result.update(failed=True, msg=str(exc))
            return result

        plan_dict = plan.to_dict()
        result["ansible_facts"] = {"provisioner_plan": plan_dict}
        storage = "proposed" if (plan_dict["storage"] or {}).get("proposed") else "not proposed"
        result["msg"] = f"{len(plan_dict['settings'])} settings, storage {storage}, {len(plan_dict['warnings'])} warning(s)"
        return result

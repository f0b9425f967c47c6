"""The Ray cluster's distributed trials: run only when named, driven with the node's Ray configuration,
sized as the hpo workload."""

from __future__ import annotations

import argparse
import importlib.util

import pytest

from provisioner.smoke.workloads import cluster


def test_the_cluster_run_is_only_when_named_and_takes_the_ray_configuration():
    class Runner:
        args = argparse.Namespace(ray_config="/etc/provisioner/ray/ray.json")

        def worker(self, task, **extra):
            return {"task": task, **extra}

    assert cluster.ONLY_WHEN_NAMED and cluster.SIZES == {"quick": {}, "full": {}}
    assert cluster.drive(Runner()) == {"task": "cluster", "ray_config": "/etc/provisioner/ray/ray.json"}


@pytest.mark.skipif(importlib.util.find_spec("ray") is not None, reason="ray is installed here")
def test_without_ray_the_cluster_run_is_a_skip_naming_its_component():
    assert cluster.w_cluster({"profile": "quick", "ray_config": "/nonexistent"}) == {
        "skipped": "ray is not installed in this environment (component distributed)"
    }

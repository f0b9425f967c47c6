"""The MLP's measuring function where torch is not installed: a skip naming the component."""

from __future__ import annotations

import importlib.util

import pytest

from provisioner.smoke.workloads import mlp


@pytest.mark.skipif(importlib.util.find_spec("torch") is not None, reason="torch is installed here")
def test_without_torch_the_mlp_is_a_skip_naming_its_component():
    assert mlp.WORKERS["mlp"]({"profile": "quick", "mode": "tuned", "threads": 2}) == {
        "skipped": "torch is not installed in this environment (component torch)"
    }

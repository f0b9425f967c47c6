"""TensorFlow's measuring function where TensorFlow is not installed: a skip naming the component."""

from __future__ import annotations

import importlib.util

import pytest

from provisioner.smoke.workloads import tensorflow


@pytest.mark.skipif(importlib.util.find_spec("tensorflow") is not None, reason="tensorflow is installed here")
def test_without_tensorflow_the_step_is_a_skip_naming_its_component():
    out = tensorflow.WORKERS["tensorflow"]({"profile": "quick", "mode": "tuned", "threads": 2, "plan": {}})
    assert out == {"skipped": "tensorflow is not installed in this environment (component tensorflow)"}

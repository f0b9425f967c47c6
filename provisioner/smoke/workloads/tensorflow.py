"""A TensorFlow Keras training step against TensorFlow's own SGEMM rate, with oneDNN as TensorFlow reports it.

Measured on the target (WORKERS, in the ML environment); judged on the control node, which
reads results.tensorflow: gflops, sgemm_gflops, sgemm_n,
samples_per_s, onednn, onednn_how, tensorflow, intra_op_threads, inter_op_threads,
threads_how, batch, width; the raw result's mode. Graded like the PyTorch step (mlp.MLP_GRADES).
"""

from __future__ import annotations

import os
import time
from typing import Any

from ..base import FAIL, WARN, Check, Objective, worst
from ..target.ml import _env_default, _env_int, _missing, median
from .mlp import step_against_sgemm

NAME = "tensorflow"
# The plan values whose change moves its figures: what the tuner may search (registry: KNOBS).
KNOBS: tuple[str, ...] = ("tf_intra_op_threads", "tf_inter_op_threads")
# What `provisioner tune` maximises: the training step's samples/s (its SGEMM reference is left out there).
# Tuned only when named (`--workloads tensorflow`): TensorFlow is a component the default stack leaves out.
TUNE = Objective("samples/s", True, lambda r: float(r["samples_per_s"]))
TUNE_WHEN_NAMED = True


# ---------------------------------------------------------------- target, ML environment

SIZES: dict[str, dict[str, Any]] = {
    "quick": {"tf_batch": 1024, "tf_width": 512, "tf_steps": 10},
    "full": {"tf_batch": 4096, "tf_width": 2048, "tf_steps": 20},
}


def w_tensorflow(p: dict[str, Any]) -> dict[str, Any]:
    """TensorFlow: a small Keras network's training step against TensorFlow's own SGEMM rate in the
    same process, with oneDNN in use as TensorFlow reports it."""
    missing = _missing("tensorflow", "tensorflow")
    if missing:
        return missing
    tuned = p["mode"] == "tuned"
    # Tuned: TensorFlow reads TF_NUM_INTRAOP_THREADS, TF_NUM_INTEROP_THREADS and TF_ENABLE_ONEDNN_OPTS
    # from the login shell's environment itself, as in a user's script: nothing is set here.
    os.environ.setdefault("TF_CPP_MIN_LOG_LEVEL", "1")
    import tensorflow as tf

    try:
        from tensorflow.python.util import _pywrap_util_port

        onednn = bool(_pywrap_util_port.IsMklEnabled())
        onednn_how = "TensorFlow's IsMklEnabled() (oneDNN operations on)"
    except (ImportError, AttributeError) as exc:
        onednn, onednn_how = None, f"TensorFlow does not say ({exc})"
    s = SIZES[p["profile"]]
    n = 2048
    sgemm: float | None = None
    if not p.get("tune"):  # tune's measurement: the training step alone
        a, b = tf.random.normal((n, n)), tf.random.normal((n, n))
        mm = tf.function(lambda u, v: tf.matmul(u, v))
        mm(a, b).numpy()
        times = []
        for _ in range(3):
            t0 = time.perf_counter()
            mm(a, b).numpy()
            times.append(time.perf_counter() - t0)
        sgemm = 2 * n**3 / median(times) / 1e9
    inputs, width, batch = 256, s["tf_width"], s["tf_batch"]
    model = tf.keras.Sequential(
        [
            tf.keras.Input((inputs,)),
            tf.keras.layers.Dense(width, activation="relu"),
            tf.keras.layers.Dense(width, activation="relu"),
            tf.keras.layers.Dense(1),
        ]
    )
    model.compile(optimizer=tf.keras.optimizers.SGD(0.01), loss="mse")
    x, y = tf.random.normal((batch, inputs)), tf.random.normal((batch, 1))
    for _ in range(3):
        model.train_on_batch(x, y)
    step_times = []
    for _ in range(3):
        t0 = time.perf_counter()
        for _ in range(s["tf_steps"]):
            model.train_on_batch(x, y)
        step_times.append((time.perf_counter() - t0) / s["tf_steps"])
    weights = inputs * width + width * width + width
    return {
        "tensorflow": tf.__version__,
        "onednn": onednn,
        "onednn_how": onednn_how,
        "intra_op_threads": _env_int("TF_NUM_INTRAOP_THREADS") if tuned else "library default",
        "inter_op_threads": _env_int("TF_NUM_INTEROP_THREADS") if tuned else "library default",
        "threads_how": _env_default(tuned, "TF_NUM_INTRAOP_THREADS", "TF_NUM_INTEROP_THREADS"),
        "batch": batch,
        "width": width,
        "step_s": step_times,
        "samples_per_s": batch / median(step_times),
        "gflops": 6 * batch * weights / median(step_times) / 1e9,
        "sgemm_gflops": sgemm,
        "sgemm_n": n,
    }


def w_tensorflow_present(_p: dict[str, Any]) -> dict[str, Any]:
    return _missing("tensorflow", "tensorflow") or {}


WORKERS = {"tensorflow": w_tensorflow, "tensorflow_present": w_tensorflow_present}


def tune_prepare(runner: Any) -> dict[str, Any]:
    """Once per tune run, before any pair: {} where the ML environment has TensorFlow, else why not (one
    reason for the knob, not one failure per candidate)."""
    return runner.worker("tensorflow_present")


# ---------------------------------------------------------------- control node


def tensorflow_checks(raw: dict[str, Any], tf: dict[str, Any]) -> list[Check]:
    """A Keras training step against TensorFlow's own SGEMM rate, with oneDNN in use as TensorFlow says."""

    def judge(status: str, reasons: list[str]) -> str:
        if tf.get("onednn") is False:
            status = FAIL if raw.get("mode") == "tuned" else worst(status, WARN)
            reasons.append("oneDNN is off (TF_ENABLE_ONEDNN_OPTS=1, role thread_env)")
        elif tf.get("onednn") is None:
            status = worst(status, WARN)
            reasons.append(f"oneDNN unknown: {tf.get('onednn_how')}")
        else:
            reasons.append("oneDNN on")
        return status

    detail = (
        f"tensorflow {tf.get('tensorflow')}, intra-op {tf.get('intra_op_threads')}, inter-op {tf.get('inter_op_threads')} "
        f"({tf.get('threads_how')}), batch {tf.get('batch')}, width {tf.get('width')}, oneDNN: {tf.get('onednn_how')}"
    )
    basis = f"tf.matmul SGEMM n={tf.get('sgemm_n')} in the same process, same threads"
    return step_against_sgemm(
        "tensorflow.step", "tensorflow", "TensorFlow Keras training step", tf, "TensorFlow's", judge, basis, detail
    )


def checks(raw: dict[str, Any], result: dict[str, Any]) -> list[Check]:
    return tensorflow_checks(raw, result)

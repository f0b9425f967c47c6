"""A TensorFlow Keras training step against TensorFlow's own SGEMM rate, with oneDNN as TensorFlow reports it.

Runs on the control node. Reads results.tensorflow: gflops, sgemm_gflops, sgemm_n,
samples_per_s, onednn, onednn_how, tensorflow, intra_op_threads, inter_op_threads,
threads_how, batch, width; the raw result's mode. Graded like the PyTorch step (mlp.MLP_GRADES).
"""

from __future__ import annotations

from typing import Any

from ..base import FAIL, WARN, Check, worst
from .mlp import step_against_sgemm

NAME = "tensorflow"


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

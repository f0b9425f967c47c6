"""The mlstack doctor's checks added with the opt-in components (roles/mlstack/files/mlstack-doctor):
the thread variables against threads.conf or the plan, one OpenMP runtime named with the import
that brought it, and the Optuna / TensorFlow / Ray checks. Pure functions, with made-up inputs;
molecule/mlstack runs the whole doctor on a lab server with TensorFlow and Ray installed."""

from __future__ import annotations

import importlib.util
import types
from importlib.machinery import SourceFileLoader
from pathlib import Path

import pytest

ROOT = Path(__file__).resolve().parents[2]


def _load():
    loader = SourceFileLoader("mlstack_doctor_new", str(ROOT / "roles/mlstack/files/mlstack-doctor"))
    spec = importlib.util.spec_from_loader(loader.name, loader)
    assert spec is not None
    module = importlib.util.module_from_spec(spec)
    loader.exec_module(module)
    return module


doctor = _load()

CONF = """# Managed by provisioner
cores=8
trials=4
threads_per_trial=2
variables="OMP_NUM_THREADS MKL_NUM_THREADS POLARS_MAX_THREADS"
scaled="ARROW_IO_THREADS=4 TF_NUM_INTEROP_THREADS=1 PROVISIONER_DATALOADER_WORKERS=2"
zero_floor="PROVISIONER_DATALOADER_WORKERS"
fixed="TF_ENABLE_ONEDNN_OPTS=1"
openmp_runtime=libiomp
kmp_blocktime=1
"""


def test_threads_conf_gives_every_variable_its_value():
    conf = doctor.parse_threads_conf(CONF)
    assert conf["fixed"] == "TF_ENABLE_ONEDNN_OPTS=1" and conf["kmp_blocktime"] == "1"
    expected, source = doctor.expected_thread_env(conf, {"threads_per_job": 99})
    assert source == doctor.THREADS_FILE
    assert expected == {"OMP_NUM_THREADS": "8", "MKL_NUM_THREADS": "8", "POLARS_MAX_THREADS": "8",
                        "ARROW_IO_THREADS": "4", "TF_NUM_INTEROP_THREADS": "1", "PROVISIONER_DATALOADER_WORKERS": "2",
                        "TF_ENABLE_ONEDNN_OPTS": "1", "KMP_BLOCKTIME": "1"}, \
        "threads.conf wins over the plan, and only what it lists"


def test_a_variable_line_the_doctor_has_never_heard_of_is_checked_too():
    conf = doctor.parse_threads_conf(CONF.replace('fixed="', 'fixed="NEW_LIB_SWITCH=on ') + "SOME_NEW_LIB_THREADS=3\n")
    expected, _ = doctor.expected_thread_env(conf, {})
    assert expected["SOME_NEW_LIB_THREADS"] == "3" and expected["NEW_LIB_SWITCH"] == "on"
    c = doctor.check_thread_env(expected, "threads.conf", {**expected, "SOME_NEW_LIB_THREADS": "8"})
    assert c["status"] == "fail" and c["detail"].startswith("SOME_NEW_LIB_THREADS=8 (threads.conf says 3)")


def test_without_threads_conf_the_plan_says():
    values = {"threads_per_job": 4, "polars_threads": 4, "arrow_io_threads": 8, "tf_intra_op_threads": 4,
              "tf_inter_op_threads": 2, "joblib_workers": 4, "trials": 4}
    expected, source = doctor.expected_thread_env({}, values)
    assert source == "the plan"
    assert expected["OMP_NUM_THREADS"] == "4" and expected["ARROW_IO_THREADS"] == "8"
    assert expected["TF_NUM_INTEROP_THREADS"] == "2" and expected["LOKY_MAX_CPU_COUNT"] == "4"
    assert expected["TF_ENABLE_ONEDNN_OPTS"] == "1"
    older, _ = doctor.expected_thread_env({}, {"threads_per_job": 4})
    assert set(older) == {"OMP_NUM_THREADS", "MKL_NUM_THREADS", "OPENBLAS_NUM_THREADS", "NUMEXPR_NUM_THREADS",
                          "NUMEXPR_MAX_THREADS"}, "a plan without the new values checks only what it has"
    assert doctor.expected_thread_env({}, {}) == ({}, "the plan")


def test_thread_env_passes_when_the_shell_and_the_libraries_agree():
    expected = {"OMP_NUM_THREADS": "8", "POLARS_MAX_THREADS": "8", "ARROW_IO_THREADS": "4"}
    taken = {"POLARS_MAX_THREADS": ("polars.thread_pool_size()", 8), "ARROW_IO_THREADS": ("pyarrow.io_thread_count()", 4)}
    c = doctor.check_thread_env(expected, "/etc/provisioner/threads.conf", dict(expected), taken)
    assert c["status"] == "pass"
    assert "3 variables as /etc/provisioner/threads.conf says" in c["detail"]
    assert "polars.thread_pool_size()=8" in c["detail"]


def test_thread_env_names_an_unset_or_wrong_variable_and_a_library_that_ignored_it():
    expected = {"OMP_NUM_THREADS": "8", "POLARS_MAX_THREADS": "8", "TF_NUM_INTRAOP_THREADS": "8"}
    env = {"OMP_NUM_THREADS": "16", "POLARS_MAX_THREADS": "8"}
    taken = {"POLARS_MAX_THREADS": ("polars.thread_pool_size()", 2)}
    c = doctor.check_thread_env(expected, "threads.conf", env, taken)
    assert c["status"] == "fail"
    assert "OMP_NUM_THREADS=16 (threads.conf says 8)" in c["detail"]
    assert "TF_NUM_INTRAOP_THREADS is unset (threads.conf says 8)" in c["detail"]
    assert "polars.thread_pool_size() is 2, not POLARS_MAX_THREADS=8" in c["detail"]
    assert "log in again" in c["detail"]
    trial = doctor.check_thread_env(expected, "threads.conf", {**env, "ML_ENV_TRIALS": "4"})
    assert "runs under ml-env --trials 4" in trial["detail"]


def test_thread_env_from_the_plan_alone_warns_on_unset_and_fails_on_wrong():
    expected = {"OMP_NUM_THREADS": "8"}
    assert doctor.check_thread_env(expected, "the plan", {}, written=False)["status"] == "warn"
    assert doctor.check_thread_env(expected, "the plan", {"OMP_NUM_THREADS": "3"}, written=False)["status"] == "fail"
    assert doctor.check_thread_env({}, "the plan", {})["status"] == "warn"


def _omp(path: str, prefix: str) -> dict:
    return {"user_api": "openmp", "internal_api": "openmp", "num_threads": 4, "prefix": prefix, "filepath": path}


def test_two_openmp_runtimes_name_both_and_the_imports_that_brought_them():
    gomp = "/usr/lib/x86_64-linux-gnu/libgomp.so.1"
    iomp = "/opt/mlstack/lib/python3.11/site-packages/tensorflow/libiomp5.so"
    c = doctor.check_openmp([_omp(gomp, "libgomp"), _omp(iomp, "libiomp")], "libgomp",
                            {gomp: "lightgbm", iomp: "tensorflow"})
    assert c["status"] == "fail" and "2 OpenMP runtimes" in c["detail"]
    assert f"GNU libgomp from system ({gomp}, loaded by import lightgbm)" in c["detail"]
    assert f"Intel libiomp from tensorflow ({iomp}, loaded by import tensorflow)" in c["detail"]


def test_copies_of_one_runtime_pass_with_who_brought_them():
    torch = "/v/site-packages/torch/lib/libgomp-a34b3233.so.1"
    sk = "/v/site-packages/scikit_learn.libs/libgomp-e985bcbb.so.1.0.0"
    c = doctor.check_openmp([_omp(torch, "libgomp"), _omp(sk, "libgomp")], "libgomp", {torch: "torch"})
    assert c["status"] == "pass" and "GNU libgomp, in 2 copies (torch, scikit-learn)" in c["detail"]


def test_imports_record_which_import_loaded_each_library(monkeypatch):
    loaded: list[str] = []
    fake = {"liba": "/x/liba.so", "libb": "/x/libb.so"}

    def fake_import(name):
        if name == "broken":
            raise ImportError("libfoo.so: cannot open shared object file")
        loaded.append(fake.get(name, f"/x/{name}.so"))
        return types.SimpleNamespace(__version__="1.0")

    monkeypatch.setattr(doctor, "loaded_libraries", lambda: list(loaded))
    monkeypatch.setattr(doctor.importlib, "import_module", fake_import)
    monkeypatch.setattr(doctor, "COMPONENT_MODULES", {"core": ("liba",), "hpo": ("libb", "broken")})
    monkeypatch.setattr(doctor, "COMPONENT_ORDER", ("core", "hpo"))
    versions, errors, brought = doctor.import_modules(["core", "hpo"])
    assert versions == {"liba": "1.0", "libb": "1.0"}
    assert brought == {"/x/liba.so": "liba", "/x/libb.so": "libb"}
    assert errors == ["broken (hpo): ImportError: libfoo.so: cannot open shared object file"]


@pytest.mark.parametrize("component, module, label", [("hpo", "optuna", "Optuna"), ("tensorflow", "tensorflow", "TensorFlow"),
                                                      ("distributed", "ray", "Ray")])
def test_component_libraries_report_their_version_or_why_not(component, module, label):
    assert doctor.LIBRARY_CHECKS[component] == (module, label)
    ok = doctor.check_library(label, module, component, {module: "2.21.0"}, [])
    assert ok["status"] == "pass" and ok["detail"].startswith(f"{label} 2.21.0 (component {component})")
    error = f"{module} ({component}): ImportError: libstdc++.so.6: version `GLIBCXX_3.4.32' not found"
    bad = doctor.check_library(label, module, component, {}, [error, "other (core): ImportError: x"])
    assert bad["status"] == "fail" and bad["name"] == label.lower()
    assert f"the {component} component is installed but {module} does not import" in bad["detail"]
    assert "GLIBCXX_3.4.32" in bad["detail"] and "other (core)" not in bad["detail"]


def test_tensorflow_needs_onednn_built_in_and_on():
    assert doctor.tensorflow_note({"onednn": True}, {"TF_ENABLE_ONEDNN_OPTS": "1"}) == (
        "pass", "oneDNN built in and on (TF_ENABLE_ONEDNN_OPTS=1)")
    assert doctor.tensorflow_note({"onednn": True}, {"TF_ENABLE_ONEDNN_OPTS": "0"})[0] == "warn"
    assert doctor.tensorflow_note({"onednn": False}, {})[0] == "warn"
    assert doctor.tensorflow_note({"error": "AttributeError: x"}, {})[0] == "warn"


def test_the_doctor_imports_what_loads_each_runtime():
    """sklearn.ensemble (scikit-learn's OpenMP), TensorFlow and Ray are imported with the rest."""
    assert "sklearn.ensemble" in doctor.COMPONENT_MODULES["core"]
    assert doctor.COMPONENT_MODULES["tensorflow"] == ("tensorflow",)
    assert "ray.tune" in doctor.COMPONENT_MODULES["distributed"]


def test_the_doctor_names_the_generation_behind_the_environments_link(tmp_path):
    gen = tmp_path / "mlstack-envs" / "3f2a9c1d0b7e"
    gen.mkdir(parents=True)
    (tmp_path / "mlstack").symlink_to(gen)
    assert doctor.generation(str(tmp_path / "mlstack")) == "3f2a9c1d0b7e"
    assert doctor.generation(str(gen)) == "3f2a9c1d0b7e"
    (tmp_path / "own").mkdir()
    assert doctor.generation(str(tmp_path / "own")) is None  # a user's environment used in place

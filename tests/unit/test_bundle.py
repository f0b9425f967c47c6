"""provisioner.bundle (lock, component selection, wheelhouse validation and build, with pip faked)
and the pure functions of the mlstack doctor (roles/mlstack/files/mlstack-doctor)."""

from __future__ import annotations

import importlib.util
import json
import re
import sys
from importlib.machinery import SourceFileLoader
from pathlib import Path

import pytest
import yaml

from provisioner import bundle
from provisioner.bundle import Pin
from provisioner.errors import BadInput, ExitCode

ROOT = Path(__file__).resolve().parents[2]
DOCTOR = ROOT / "roles" / "mlstack" / "files" / "mlstack-doctor"
FILTERS = ROOT / "plugins" / "filter" / "mlstack.py"


def _load(name: str, path: Path):
    loader = SourceFileLoader(name, str(path))
    spec = importlib.util.spec_from_loader(name, loader)
    assert spec is not None
    module = importlib.util.module_from_spec(spec)
    loader.exec_module(module)
    return module


doctor = _load("mlstack_doctor", DOCTOR)
filters = _load("mlstack_filters", FILTERS)

LOCK_TEXT = """
schema: 1
python_version: '3.11'
glibc: '2.28'
arch: x86_64
requirements:
  core: [numpy, scikit-learn]
  torch: [torch==2.13.0+cpu]
components:
  core: [numpy==2.4.6, scikit-learn==1.9.1, typing_extensions==4.16.0]
  torch: [torch==2.13.0+cpu, numpy==2.4.6, Typing-Extensions==4.16.0]
"""


def lock():
    return bundle.parse_lock(LOCK_TEXT)


# --------------------------------------------------------------------------- the lock


def test_parse_lock_normalizes_names():
    parsed = lock()
    assert parsed.python_version == "3.11"
    assert Pin("typing-extensions", "4.16.0") in parsed.components["torch"]
    assert str(parsed.components["torch"][0]) == "torch==2.13.0+cpu"


@pytest.mark.parametrize(
    "text, message",
    [
        ("schema: 2\ncomponents: {core: [a==1]}", "schema 2"),
        ("schema: 1\ncomponents: {}", "no components"),
        ("schema: 1\ncomponents: {core: [numpy>=2]}", "'numpy>=2' is not a pin"),
        ("schema: 1\ncomponents: {core: [numpy]}", "'numpy' is not a pin"),
        ("schema: 1\ncomponents: {core: [numpy==2.4.6], gbdt: [numpy==2.3.0]}", "pins numpy twice"),
        ("schema: 1\nglibc: '3.1'\ncomponents: {core: [numpy==2.4.6]}", "not like 2.28"),
        ("[unclosed", "not valid YAML"),
    ],
)
def test_parse_lock_refuses(text, message):
    with pytest.raises(BadInput, match=message):
        bundle.parse_lock(text)


def test_render_and_parse_round_trip():
    parsed = lock()
    again = bundle.parse_lock(bundle.render_lock(parsed))
    assert again.components == parsed.components
    assert again.requirements == parsed.requirements
    assert "provisioner bundle --update-lock" in bundle.render_lock(parsed)


def test_select_components_adds_core_and_keeps_order():
    assert bundle.select_components(["torch"]) == ["core", "torch"]
    assert bundle.select_components(["notebook", "gbdt", "core", "gbdt"]) == ["core", "gbdt", "notebook"]
    with pytest.raises(BadInput, match="unknown component gpu; known: core, gbdt"):
        bundle.select_components(["gpu"])


def test_select_pins_unions_components_once_each():
    pins = bundle.select_pins(lock(), ["torch"])
    assert [str(p) for p in pins] == ["numpy==2.4.6", "scikit-learn==1.9.1", "torch==2.13.0+cpu", "typing-extensions==4.16.0"]
    assert [p.name for p in bundle.select_pins(lock(), [])] == ["numpy", "scikit-learn", "typing-extensions"]
    with pytest.raises(BadInput, match="the lock has no component gbdt"):
        bundle.select_pins(lock(), ["gbdt"])


def test_manylinux_platforms():
    plats = bundle.manylinux_platforms("2.28")
    assert plats[0] == "manylinux_2_28_x86_64" and "manylinux_2_17_x86_64" in plats
    assert {"manylinux2014_x86_64", "manylinux2010_x86_64", "manylinux1_x86_64"} <= set(plats)
    assert "manylinux_2_31_x86_64" not in plats
    assert "manylinux2014_x86_64" not in bundle.manylinux_platforms("2.12")
    with pytest.raises(BadInput):
        bundle.manylinux_platforms("2.x")


# --------------------------------------------------------------------------- the repository's lock


def test_repository_lock_is_complete_and_cpu_only():
    real = bundle.load_lock()
    assert real.python_version == "3.11" and real.arch == "x86_64"
    assert set(real.components) == set(bundle.COMPONENTS)
    names = {p.name: p.version for pins in real.components.values() for p in pins}
    assert names["torch"] == "2.13.0+cpu", "torch must be the CPU build"
    assert "xgboost-cpu" in names and "xgboost" not in names, "plain xgboost carries CUDA"
    assert not [n for n in names if n.startswith(("nvidia-", "triton", "cuda"))], "no CUDA libraries"
    core = {p.name for p in real.components["core"]}
    assert {"numpy", "scipy", "pandas", "polars", "pyarrow", "scikit-learn", "threadpoolctl"} <= core
    assert {"lightgbm", "catboost"} <= {p.name for p in real.components["gbdt"]}
    assert {"fastapi", "uvicorn"} <= {p.name for p in real.components["serving"]}
    assert {"jupyterlab", "ipykernel"} <= {p.name for p in real.components["notebook"]}
    assert "scikit-learn-intelex" in {p.name for p in real.components["sklearnex"]}
    tensorflow = {p.name for p in real.components["tensorflow"]}
    assert "tensorflow-cpu" in tensorflow and "tensorflow" not in names, "plain tensorflow is the GPU-capable build"
    assert "keras" in tensorflow and names["numpy"] == "2.4.6", "tensorflow shares the stack's numpy"
    # Each component's closure holds its own requirements.
    for component, reqs in real.requirements.items():
        have = {p.name for p in real.components[component]}
        for req in reqs:
            name = bundle.canonicalize_name(bundle.Requirement(req).name)
            assert name in have, f"{component} lacks its requirement {req}"


# --------------------------------------------------------------------------- closures


def _item(name, version, requires=()):
    return {"metadata": {"name": name, "version": version, "requires_dist": list(requires)}}


def test_closures_follow_markers_and_extras():
    report = {
        "install": [
            _item("ray", "2.60.0", ["click>=7", "pandas; extra == 'tune'", "pywin32; sys_platform == 'win32'"]),
            _item("click", "8.5.1"),
            _item("pandas", "3.1.1", ["numpy>=1.26", "tzdata; python_version < '3.9'"]),
            _item("numpy", "2.4.6"),
            _item("torch", "2.13.0+cpu", ["setuptools; python_version >= '3.12'", "filelock"]),
            _item("filelock", "4.3.1"),
        ]
    }
    env = bundle.marker_environment("3.11")
    out = bundle.closures(report, {"distributed": ["ray[tune]"], "plain": ["ray"], "torch": ["torch==2.13.0+cpu"]}, env)
    assert [str(p) for p in out["distributed"]] == ["click==8.5.1", "numpy==2.4.6", "pandas==3.1.1", "ray==2.60.0"]
    assert [str(p) for p in out["plain"]] == ["click==8.5.1", "ray==2.60.0"]
    assert [str(p) for p in out["torch"]] == ["filelock==4.3.1", "torch==2.13.0+cpu"]
    with pytest.raises(BadInput, match="lacks missing"):
        bundle.closures(report, {"x": ["missing"]}, env)


# --------------------------------------------------------------------------- wheelhouse validation

WHEELS = [
    "numpy-2.4.6-cp311-cp311-manylinux_2_27_x86_64.manylinux_2_28_x86_64.whl",
    "scikit_learn-1.9.1-cp311-cp311-manylinux_2_27_x86_64.manylinux_2_28_x86_64.whl",
    "typing_extensions-4.16.0-py3-none-any.whl",
    "torch-2.13.0+cpu-cp311-cp311-manylinux_2_28_x86_64.whl",
]


def test_validate_wheelhouse_matches_normalized_names_and_versions(tmp_path):
    check = bundle.validate_wheelhouse(tmp_path, bundle.select_pins(lock(), ["torch"]), files=WHEELS)
    assert check.ok, check.problems()
    assert check.found[Pin("scikit-learn", "1.9.1")].startswith("scikit_learn-1.9.1")
    assert check.found[Pin("torch", "2.13.0+cpu")] == WHEELS[3]


def test_validate_wheelhouse_names_missing_and_wrong_pins(tmp_path):
    pins = [Pin("numpy", "2.4.7"), Pin("joblib", "1.6.0"), Pin("torch", "2.13.0")]
    check = bundle.validate_wheelhouse(tmp_path, pins, files=WHEELS)
    assert not check.ok
    problems = check.problems()
    assert f"numpy==2.4.7: no wheel in {tmp_path} (it has numpy 2.4.6)" in problems
    assert f"joblib==1.6.0: no wheel in {tmp_path}" in problems
    # torch==2.13.0 is PyPI's CUDA build, not the +cpu wheel the wheelhouse holds.
    assert any(p.startswith("torch==2.13.0: no wheel") for p in problems)
    with pytest.raises(BadInput, match=re.escape("joblib==1.6.0")):
        check.raise_for_problems("rebuild it")


def test_validate_wheelhouse_refuses_wheels_for_another_python(tmp_path):
    files = ["numpy-2.4.6-cp312-cp312-manylinux_2_28_x86_64.whl", "numpy-2.4.6-cp311-cp311-macosx_11_0_arm64.whl"]
    check = bundle.validate_wheelhouse(tmp_path, [Pin("numpy", "2.4.6")], files=files)
    assert list(check.incompatible) == [Pin("numpy", "2.4.6")]
    assert "is not built for the target" in check.problems()[0]
    newer_glibc = ["numpy-2.4.6-cp311-cp311-manylinux_2_34_x86_64.whl"]
    assert not bundle.validate_wheelhouse(tmp_path, [Pin("numpy", "2.4.6")], files=newer_glibc).ok
    assert bundle.validate_wheelhouse(
        tmp_path, [Pin("numpy", "2.4.6")], files=newer_glibc, platforms=bundle.manylinux_platforms("2.36")
    ).ok


def test_validate_wheelhouse_reads_the_directory(tmp_path):
    for name in [*WHEELS, "README.txt", "broken.whl"]:
        (tmp_path / name).write_bytes(b"")
    assert bundle.validate_wheelhouse(tmp_path, bundle.select_pins(lock(), ["torch"])).ok
    assert not bundle.validate_wheelhouse(tmp_path / "absent", [Pin("numpy", "2.4.6")]).ok


def test_missing_package_from_pip_output():
    out = "ERROR: Could not find a version ...\nERROR: No matching distribution found for numpy==9.9.9\n"
    assert bundle.missing_package(out) == "numpy==9.9.9"
    assert bundle.missing_package("ERROR: something else") is None


# --------------------------------------------------------------------------- build_wheelhouse, pip faked


class FakePip:
    """Stands in for `python -m pip download`: writes a wheel per requested pin, or fails."""

    def __init__(self, fail_for: str | None = None):
        self.calls: list[list[str]] = []
        self.pins: list[list[str]] = []
        self.fail_for = fail_for

    def __call__(self, args, what, timeout):
        import subprocess

        self.calls.append(args)
        dest = Path(args[args.index("--dest") + 1])
        pins = Path(args[args.index("-r") + 1]).read_text().split()
        self.pins.append(pins)
        for text in pins:
            if self.fail_for and text.startswith(self.fail_for):
                return subprocess.CompletedProcess(args, 1, "", f"ERROR: No matching distribution found for {text}\n")
            name, version = text.split("==")
            (dest / f"{name.replace('-', '_')}-{version}-py3-none-any.whl").write_bytes(b"x" * 10)
        return subprocess.CompletedProcess(args, 0, "", "")


@pytest.fixture()
def lock_file(tmp_path):
    path = tmp_path / "mlstack.lock"
    path.write_text(LOCK_TEXT)
    return path


def test_build_wheelhouse_downloads_then_reuses(tmp_path, lock_file, monkeypatch):
    pip = FakePip()
    monkeypatch.setattr(bundle, "_run_pip", pip)
    dest = tmp_path / "wh"
    first = bundle.build_wheelhouse(dest, ["core"], lock_path=lock_file)
    assert first.downloaded == 3 and first.reused == 0 and first.bytes == 30
    assert first.components == ["core"] and len(first.files) == 3
    args = pip.calls[0]
    assert args[:2] == ["download", "--no-deps"] and "--only-binary=:all:" in args
    assert args[args.index("--python-version") + 1] == "3.11" and "manylinux_2_28_x86_64" in args
    manifest = json.loads((dest / bundle.MANIFEST).read_text())
    assert manifest["components"] == ["core"] and len(manifest["pins"]) == 3

    second = bundle.build_wheelhouse(dest, ["core"], lock_path=lock_file)
    assert len(pip.calls) == 1, "a complete wheelhouse must not call pip"
    assert second.downloaded == 0 and second.reused == 3 and second.files == first.files


def test_build_wheelhouse_takes_torch_from_its_index(tmp_path, lock_file, monkeypatch):
    pip = FakePip()
    monkeypatch.setattr(bundle, "_run_pip", pip)
    bundle.build_wheelhouse(tmp_path / "wh", ["torch"], lock_path=lock_file, index_url="https://mirror.example/simple",
                            torch_index_url="https://download.pytorch.org/whl/cpu")
    rest, torch = pip.calls
    assert rest[rest.index("--index-url") + 1] == "https://mirror.example/simple"
    assert torch[torch.index("--index-url") + 1] == "https://download.pytorch.org/whl/cpu"
    assert pip.pins[0] == ["numpy==2.4.6", "scikit-learn==1.9.1", "typing-extensions==4.16.0"]
    assert pip.pins[1] == ["torch==2.13.0+cpu"]


def test_build_wheelhouse_names_a_package_pip_cannot_find(tmp_path, lock_file, monkeypatch):
    monkeypatch.setattr(bundle, "_run_pip", FakePip(fail_for="scikit-learn"))
    with pytest.raises(BadInput, match=r"pip found no wheel for scikit-learn==1\.9\.1") as err:
        bundle.build_wheelhouse(tmp_path / "wh", ["core"], lock_path=lock_file)
    assert err.value.exit_code == ExitCode.BAD_INPUT


def test_build_wheelhouse_refuses_a_lock_for_another_python(tmp_path, lock_file):
    with pytest.raises(BadInput, match=re.escape("resolved for Python 3.11, not 3.12")):
        bundle.build_wheelhouse(tmp_path / "wh", ["core"], lock_path=lock_file, python_version="3.12")


def test_missing_lock_is_named(tmp_path):
    with pytest.raises(BadInput, match="cannot read the lock"):
        bundle.load_lock(tmp_path / "none.lock")


def test_generate_lock_refuses_another_python():
    other = "3.12" if sys.version_info[:2] != (3, 12) else "3.11"
    with pytest.raises(BadInput, match=f"with Python {other}"):
        bundle.generate_lock(None, python_version=other)


# --------------------------------------------------------------------------- the role's filters


def test_role_filters_agree_with_bundle(tmp_path):
    data = filters.mlstack_lock(LOCK_TEXT)
    assert filters.mlstack_pins(data, ["torch"]) == [str(p) for p in bundle.select_pins(lock(), ["torch"])]
    pins = filters.mlstack_pins(data, ["core"])
    ok = filters.mlstack_wheelhouse_check(pins, [f"/x/{w}" for w in WHEELS], "/x", data)
    assert ok["ok"] and len(ok["files"]) == 3
    bad = filters.mlstack_wheelhouse_check(pins, [f"/x/{w}" for w in WHEELS[:1]], "/x", data)
    assert not bad["ok"] and "scikit-learn==1.9.1: no wheel in /x" in bad["problems"]
    failure = {"stderr": "ERROR: No matching distribution found for numpy>=1.24.1\n", "msg": "stdout: ..."}
    assert filters.mlstack_pip_failure(failure) == "no wheel for numpy>=1.24.1 among the available ones"


# --------------------------------------------------------------------------- the doctor

AVX512 = {"avx", "avx2", "fma", "avx512f", "avx512bw", "avx512dq", "avx512vl", "avx512cd"}


def openblas(owner: str, arch: str, threads: int = 4) -> dict:
    return {"user_api": "blas", "internal_api": "openblas", "num_threads": threads, "prefix": "libscipy_openblas",
            "filepath": f"/opt/mlstack/lib/python3.11/site-packages/{owner}.libs/libscipy_openblas.so",
            "version": "0.3.31", "architecture": arch}


def gomp(path: str, prefix: str = "libgomp", threads: int = 4) -> dict:
    return {"user_api": "openmp", "internal_api": "openmp", "num_threads": threads, "prefix": prefix, "filepath": path}


def test_doctor_reads_cpuinfo_and_isa():
    text = "processor : 0\nvendor_id : AuthenticAMD\nmodel name : AMD EPYC 4584PX\nflags : fpu avx avx2 fma avx512f avx512bw avx512dq avx512vl avx512cd\n\nprocessor : 1\nflags : fpu\n"
    info = doctor.read_cpuinfo(text)
    assert info["vendor"] == "AuthenticAMD" and "avx512f" in info["flags"]
    assert doctor.isa_level(info["flags"]) == "avx512"
    assert doctor.isa_level({"avx", "avx2", "fma"}) == "avx2"
    assert doctor.isa_level({"avx"}) == "avx"
    assert doctor.isa_level({"sse4_2"}) == "sse"


def test_doctor_library_owner():
    assert doctor.library_owner("/v/lib/python3.11/site-packages/numpy.libs/libscipy_openblas64_.so") == "numpy"
    assert doctor.library_owner("/v/lib/python3.11/site-packages/torch/lib/libgomp.so.1") == "torch"
    assert doctor.library_owner("/v/lib/python3.11/site-packages/scikit_learn.libs/libgomp-e9.so") == "scikit-learn"
    assert doctor.library_owner("/usr/lib/x86_64-linux-gnu/libgomp.so.1") == "system"


def test_doctor_blas_kernel_passes_for_the_cpu():
    c = doctor.check_blas_kernel([openblas("numpy", "SkylakeX"), openblas("scipy", "Cooperlake")], "avx512", {})
    assert c["status"] == "pass" and "numpy: openblas 0.3.31 SkylakeX" in c["detail"]
    assert doctor.check_blas_kernel([openblas("numpy", "Zen")], "avx2", {})["status"] == "pass"


@pytest.mark.parametrize("arch", ["Haswell", "Prescott", "Sandybridge"])
def test_doctor_blas_kernel_fails_below_avx512_and_names_openblas_coretype(arch):
    c = doctor.check_blas_kernel([openblas("numpy", arch)], "avx512", {"OPENBLAS_CORETYPE": arch})
    assert c["status"] == "fail"
    assert f"runs the {arch} kernel on this AVX-512 CPU" in c["detail"]
    assert f"cause: OPENBLAS_CORETYPE={arch} is set" in c["detail"]
    without = doctor.check_blas_kernel([openblas("numpy", arch)], "avx512", {})
    assert without["status"] == "fail" and "OPENBLAS_CORETYPE" not in without["detail"]


def test_doctor_blas_kernel_mkl_capped_by_environment():
    mkl = {"user_api": "blas", "internal_api": "mkl", "num_threads": 4, "filepath": "/v/site-packages/mkl/libmkl_rt.so"}
    assert doctor.check_blas_kernel([mkl], "avx512", {})["status"] == "pass"
    c = doctor.check_blas_kernel([mkl], "avx512", {"MKL_ENABLE_INSTRUCTIONS": "AVX2"})
    assert c["status"] == "fail" and "MKL_ENABLE_INSTRUCTIONS=AVX2" in c["detail"]
    assert doctor.check_blas_kernel([], "avx512", {})["status"] == "fail"


def test_doctor_openmp_one_runtime_in_copies_passes():
    info = [gomp("/v/site-packages/torch/lib/libgomp.so.1"), gomp("/v/site-packages/scikit_learn.libs/libgomp-1.so")]
    c = doctor.check_openmp(info, "libgomp")
    assert c["status"] == "pass" and "GNU libgomp, in 2 copies (torch, scikit-learn)" in c["detail"]


def test_doctor_openmp_mix_fails_with_its_consequence():
    info = [gomp("/v/site-packages/torch/lib/libgomp.so.1"), gomp("/v/site-packages/mkl/libiomp5.so", "libiomp")]
    c = doctor.check_openmp(info, "libgomp")
    assert c["status"] == "fail"
    assert "2 OpenMP runtimes" in c["detail"] and "Intel libiomp from mkl" in c["detail"]
    assert "oversubscribe" in c["detail"] and "crash or deadlock" in c["detail"]


def test_doctor_openmp_other_than_the_plan_and_none():
    c = doctor.check_openmp([gomp("/v/site-packages/x/libiomp5.so", "libiomp")], "libgomp")
    assert c["status"] == "fail" and "plan's openmp_runtime is libgomp" in c["detail"]
    assert doctor.check_openmp([], "libgomp")["status"] == "warn"


def test_doctor_threads_against_the_plan():
    info = [openblas("numpy", "SkylakeX", 8), gomp("/v/site-packages/torch/lib/libgomp.so.1", threads=8)]
    assert doctor.check_threads(info, 8, "plan", 8, {})["status"] == "pass"
    c = doctor.check_threads(info, 4, "plan threads_per_job", 8, {"OMP_NUM_THREADS": "8"})
    assert c["status"] == "fail" and "numpy openblas has 8" in c["detail"] and "torch intra-op has 8" in c["detail"]
    assert "OMP_NUM_THREADS=8, MKL_NUM_THREADS=unset" in c["detail"]
    assert doctor.check_threads(info, None, "", 8, {})["status"] == "warn"


def test_doctor_torch_checks():
    good = {"mkl": True, "mkldnn": True, "capability": "AVX512", "threads": 4}
    assert [c["status"] for c in doctor.check_torch(good, "avx512", {})] == ["pass", "pass", "pass"]
    slow = {**good, "capability": "AVX2", "mkl": False}
    out = {c["name"]: c for c in doctor.check_torch(slow, "avx512", {"ATEN_CPU_CAPABILITY": "avx2"})}
    assert out["torch-mkl"]["status"] == "fail"
    assert out["torch-isa"]["status"] == "fail" and "ATEN_CPU_CAPABILITY=avx2" in out["torch-isa"]["detail"]
    assert doctor.check_torch(None, "avx512", {})[0]["status"] == "skip"
    assert doctor.check_torch({"error": "boom"}, "avx512", {})[0]["status"] == "fail"


def test_doctor_blas_choice_follows_the_plan():
    plan = {"values": {"blas": "mkl", "blas_numpy": "openblas"}, "reasons": {"blas": "mkl: torch bundles MKL"}}
    info = [openblas("numpy", "SkylakeX")]
    c = doctor.check_blas_choice(info, plan, {"mkl": True}, "GenuineIntel")
    assert c["status"] == "pass" and "plan blas=mkl (torch bundles MKL)" in c["detail"]
    assert doctor.check_blas_choice(info, plan, {"mkl": False}, "GenuineIntel")["status"] == "fail"
    assert "not installed" in doctor.check_blas_choice(info, plan, None, "GenuineIntel")["detail"]
    amd = {"values": {"blas": "openblas", "blas_numpy": "openblas"}, "reasons": {}}
    assert doctor.check_blas_choice(info, amd, None, "AuthenticAMD")["status"] == "pass"


def test_doctor_usage_error(capsys):
    assert doctor.main(["--threads", "0"]) == doctor.USAGE_ERROR
    assert "--threads must be 1 or more" in capsys.readouterr().err


def test_doctor_runs_here_with_threadpoolctl_missing_or_present(tmp_path, capsys):
    """The whole doctor in this interpreter (whatever it has installed): JSON with every check."""
    cpuinfo = tmp_path / "cpuinfo"
    cpuinfo.write_text("vendor_id : GenuineIntel\nmodel name : Test\nflags : avx avx2 fma\n")
    manifest = tmp_path / "mlstack.json"
    manifest.write_text(json.dumps({"components": ["core"]}))
    rc = doctor.main(["--json", "--cpuinfo", str(cpuinfo), "--manifest", str(manifest), "--plan", str(tmp_path / "no-plan"),
                      "--threads-conf", str(tmp_path / "no-threads.conf")])
    result = json.loads(capsys.readouterr().out)
    assert rc == (0 if result["ok"] else 1)
    assert result["cpu"]["isa"] == "avx2" and result["components"] == ["core"]
    assert {c["name"] for c in result["checks"]} >= {"imports", "blas-choice", "blas-kernel", "openmp", "threads",
                                                     "thread-env"}


def test_lock_file_is_valid_yaml_with_a_header():
    text = bundle.DEFAULT_LOCK.read_text()
    assert text.startswith("# The ML stack")
    assert yaml.safe_load(text)["schema"] == 1


# --------------------------------------------------------------------------- the role's pip options


def role_values(tmp_path: Path, names: list[str], **variables) -> dict:
    """Render the role's internal variables for VARIABLES with ansible-playbook on localhost
    (nothing is changed; the JSON callback reports the debug task's values)."""
    import os
    import subprocess

    book = tmp_path / "render.yml"
    book.write_text(yaml.safe_dump([{
        "name": "Render", "hosts": "localhost", "connection": "local", "gather_facts": False,
        "vars_files": [str(ROOT / "roles/mlstack/defaults/main.yml"), str(ROOT / "roles/mlstack/vars/main.yml")],
        "tasks": [{"name": "Show", "ansible.builtin.debug": {"msg": {n: f"{{{{ {n} }}}}" for n in names}}}],
    }]))
    extra = tmp_path / "vars.json"
    extra.write_text(json.dumps(variables))
    bindir = Path(sys.executable).parent
    r = subprocess.run(
        [str(bindir / "ansible-playbook"), "-i", "localhost,", "-e", f"@{extra}", str(book)],
        capture_output=True, text=True, timeout=120,
        env={**os.environ, "ANSIBLE_STDOUT_CALLBACK": "ansible.builtin.json", "PATH": f"{bindir}:{os.environ['PATH']}",
             "ANSIBLE_LOCALHOST_WARNING": "false", "ANSIBLE_INVENTORY_UNPARSED_WARNING": "false"},
    )
    assert r.returncode == 0, r.stdout[-2000:] + r.stderr[-2000:]
    return json.loads(r.stdout)["plays"][0]["tasks"][0]["hosts"]["localhost"]["msg"]


def test_role_pip_options_offline_online_and_torch(tmp_path):
    names = ["_mlstack_pip_args", "_mlstack_components", "_mlstack_apt_packages", "_mlstack_offline"]
    offline = role_values(tmp_path, names, mlstack_wheelhouse="/srv/wheels", mlstack_components=["torch"],
                          _mlstack_is_local=False)
    assert offline["_mlstack_offline"] is True
    assert offline["_mlstack_pip_args"][:3] == ["--no-index", "--find-links", "/var/cache/provisioner/mlstack-wheelhouse"]
    assert offline["_mlstack_components"] == ["core", "torch"]
    assert offline["_mlstack_apt_packages"] == ["python3-venv"]

    online = role_values(tmp_path, names, mlstack_components=["gbdt", "torch"], mlstack_sklearnex=True,
                         mlstack_index_url="https://mirror.example/simple", mlstack_extra_index_urls=["https://x.example/simple"])
    args = online["_mlstack_pip_args"]
    assert "--no-index" not in args and online["_mlstack_offline"] is False
    assert args[:2] == ["--index-url", "https://mirror.example/simple"]
    assert "--extra-index-url=https://x.example/simple" in args
    assert "--extra-index-url=https://download.pytorch.org/whl/cpu" in args
    assert online["_mlstack_components"] == ["core", "gbdt", "torch", "sklearnex"]
    assert online["_mlstack_apt_packages"] == ["python3-venv", "libgomp1"]

    default = role_values(tmp_path, names)
    assert default["_mlstack_components"] == list(bundle.DEFAULT_COMPONENTS)
    assert "--extra-index-url=https://download.pytorch.org/whl/cpu" in default["_mlstack_pip_args"]
    # An index that did not answer from the host (shared's indexes entry point) is left out.
    unreachable = role_values(tmp_path, names, mlstack_extra_index_urls=["https://x.example/simple"],
                              shared_unreachable_indexes=["https://download.pytorch.org/whl/cpu"])
    assert "--extra-index-url=https://x.example/simple" in unreachable["_mlstack_pip_args"]
    assert not any("download.pytorch.org" in a for a in unreachable["_mlstack_pip_args"])
    no_torch = role_values(tmp_path, names, mlstack_components=["core", "tensorflow", "distributed"])
    assert not any("download.pytorch.org" in a for a in no_torch["_mlstack_pip_args"])
    assert no_torch["_mlstack_components"] == ["core", "tensorflow", "distributed"]
    assert no_torch["_mlstack_apt_packages"] == ["python3-venv"]


def test_the_default_components_are_written_the_same_everywhere():
    """The role's default, its argument spec, the bundle's default and the role's README name the
    same components, every one of them in the lock; the doctor knows every component."""
    default = yaml.safe_load((ROOT / "roles/mlstack/defaults/main.yml").read_text())["mlstack_components"]
    spec = yaml.safe_load((ROOT / "roles/mlstack/meta/argument_specs.yml").read_text())
    option = spec["argument_specs"]["main"]["options"]["mlstack_components"]
    assert default == option["default"] == list(bundle.DEFAULT_COMPONENTS) == ["core", "gbdt", "torch", "hpo", "serving"]
    assert set(bundle.DEFAULT_COMPONENTS) <= set(bundle.COMPONENTS) <= set(bundle.load_lock().components)
    readme = (ROOT / "roles/mlstack/README.md").read_text()
    assert f"mlstack_components: [{', '.join(bundle.DEFAULT_COMPONENTS)}]" in readme
    described = " ".join(option["description"])
    for component in bundle.COMPONENTS:
        assert f"{component} (" in described, f"argument_specs does not describe component {component}"
        assert f"| {component}" in readme, f"the role README's table lacks component {component}"
    assert set(doctor.COMPONENT_MODULES) == set(bundle.COMPONENTS) == set(doctor.COMPONENT_ORDER)


def test_constraints_name_every_pin_once():
    assert bundle.constraint_lines(lock()) == [
        "numpy==2.4.6",
        "scikit-learn==1.9.1",
        "torch==2.13.0+cpu",
        "typing-extensions==4.16.0",
    ]


@pytest.mark.skipif(sys.version_info[:2] != (3, 11), reason="the lock is resolved with the targets' Python 3.11")
def test_adding_a_requirement_keeps_the_existing_pins_unless_upgrade(tmp_path):
    """A real resolve against the package index: an old pin stays, a new requirement is pinned,
    and --upgrade moves the old pin to the newest release."""
    path = tmp_path / "mlstack.lock"
    path.write_text(
        "schema: 1\npython_version: '3.11'\nglibc: '2.28'\narch: x86_64\n"
        "requirements:\n  core: [six, idna]\ncomponents:\n  core: [six==1.15.0]\n"
    )
    kept = bundle.generate_lock(path, timeout=300)
    assert Pin("six", "1.15.0") in kept.components["core"]
    assert any(p.name == "idna" for p in kept.components["core"])
    assert bundle.load_lock(path).components == kept.components
    upgraded = bundle.generate_lock(path, timeout=300, upgrade=True)
    six = next(p for p in upgraded.components["core"] if p.name == "six")
    assert six.version != "1.15.0"

"""The ML stack's lock file and wheelhouse (offline installs of roles/mlstack).

``requirements/mlstack.lock`` pins every package of every component, transitive dependencies
included, as ``name==version`` under its component (a YAML mapping component -> pins), for one
target: CPython 3.11 on manylinux x86_64.  A wheelhouse is a directory of the wheels for the
pins of some components; the mlstack role pushes it to the target and installs with
``pip --no-index --find-links``: no index is contacted on the target.

Public API (the ``provisioner bundle`` command calls these):

- :func:`build_wheelhouse` downloads the wheels of the chosen components into a directory,
  reusing the wheels already there (a cache), and returns a :class:`BundleResult`.
- :func:`generate_lock` resolves the lock's requirements with pip's resolver and writes the
  lock (``provisioner bundle --update-lock`` regenerates ``requirements/mlstack.lock``).
- Pure helpers: :func:`parse_lock`, :func:`load_lock`, :func:`select_components`,
  :func:`select_pins`, :func:`validate_wheelhouse`, :func:`closures`,
  :func:`manylinux_platforms`, :func:`parse_wheel`.

A missing pin, a package pip cannot find or a wheel missing from a wheelhouse raises
:class:`~provisioner.errors.BadInput` naming the package (exit code 2).
"""

from __future__ import annotations

import json
import os
import re
import subprocess
import sys
import tempfile
import time
from collections.abc import Iterable, Mapping, Sequence
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any, NoReturn

import yaml
from packaging import tags as _tags
from packaging.markers import Marker
from packaging.requirements import Requirement
from packaging.utils import InvalidWheelFilename, canonicalize_name, parse_wheel_filename
from packaging.version import InvalidVersion, Version

from . import paths
from .errors import BadInput, ProvisionerError
from .system import locked, run

LOCK_SCHEMA = 1
DEFAULT_LOCK = paths.REQUIREMENTS / "mlstack.lock"
MANIFEST = "wheelhouse.json"
DEFAULT_PYTHON = "3.11"
DEFAULT_GLIBC = "2.28"  # manylinux_2_28: Debian 10+, Ubuntu 18.10+, RHEL 8+
DEFAULT_ARCH = "x86_64"
# The documented default of mlstack_torch_index_url; never contacted by the tests.
PYTORCH_CPU_INDEX = "https://download.pytorch.org/whl/cpu"
# Packages that come from the torch index when one is given (its CPU builds carry +cpu).
TORCH_INDEX_PACKAGES = frozenset({"torch", "torchvision", "torchaudio"})

# Components in install order; core is always part of a selection (the doctor needs numpy and
# threadpoolctl). The requirements are the input of generate_lock; the lock records them.
COMPONENTS: tuple[str, ...] = ("core", "gbdt", "torch", "hpo", "serving", "tensorflow", "distributed", "notebook", "sklearnex")
ALWAYS = ("core",)
# What roles/mlstack installs unless told otherwise (mlstack_components) and what
# `provisioner bundle` downloads without -c: the tabular stack, PyTorch, Optuna and the model
# server; tensorflow, distributed (Ray), notebook and sklearnex are opt-in.
DEFAULT_COMPONENTS: tuple[str, ...] = ("core", "gbdt", "torch", "hpo", "serving")
DEFAULT_REQUIREMENTS: dict[str, list[str]] = {
    "core": ["numpy", "scipy", "pandas", "polars", "pyarrow", "scikit-learn", "threadpoolctl"],
    # xgboost-cpu: the CPU-only XGBoost wheel; plain xgboost pulls CUDA libraries.
    "gbdt": ["xgboost-cpu", "lightgbm", "catboost"],
    # The CPU build (MKL and oneDNN inside): the local version +cpu never matches PyPI's CUDA build.
    "torch": ["torch==2.13.0+cpu"],
    "hpo": ["optuna"],
    "distributed": ["ray[tune]"],
    # orjson: the model server's JSON (a quarter more requests/s than the standard library's).
    "serving": ["fastapi", "uvicorn[standard]", "prometheus-client", "orjson"],
    # The CPU-only TensorFlow build (oneDNN inside); plain tensorflow is the same code with GPU support.
    "tensorflow": ["tensorflow-cpu"],
    "notebook": ["jupyterlab", "ipykernel"],
    "sklearnex": ["scikit-learn-intelex"],
}

_PIN_RE = re.compile(r"^\s*([A-Za-z0-9](?:[A-Za-z0-9._-]*[A-Za-z0-9])?)\s*==\s*([A-Za-z0-9.+!_-]+)\s*$")
_NO_MATCH_RE = re.compile(r"No matching distribution found for ([^\s;]+)")


# --------------------------------------------------------------------------- data


@dataclass(frozen=True, order=True)
class Pin:
    """One pinned distribution: a canonical name and an exact version."""

    name: str
    version: str

    def __str__(self) -> str:
        return f"{self.name}=={self.version}"

    @classmethod
    def parse(cls, text: str, where: str = "") -> Pin:
        m = _PIN_RE.match(str(text))
        if not m:
            raise BadInput(f"{where}{text!r} is not a pin: write NAME==VERSION, like numpy==2.4.6")
        name, version = m.groups()
        try:
            Version(version)
        except InvalidVersion:
            raise BadInput(f"{where}{text!r}: {version!r} is not a valid version") from None
        return cls(canonicalize_name(name), version)

    def matches(self, name: str, version: str | Version) -> bool:
        """True when NAME and VERSION (from a wheel file name) are this pin."""
        return canonicalize_name(name) == self.name and _same_version(version, self.version)


@dataclass
class Lock:
    python_version: str
    glibc: str  # oldest glibc of the targets: the manylinux platforms the pins have wheels for
    arch: str
    requirements: dict[str, list[str]]
    components: dict[str, list[Pin]]

    @property
    def platforms(self) -> list[str]:
        return manylinux_platforms(self.glibc, self.arch)

    def to_text(self) -> str:
        return render_lock(self)


@dataclass
class Wheel:
    file: str
    name: str
    version: str
    tags: frozenset[Any]


@dataclass
class WheelhouseCheck:
    """What a wheelhouse holds for a list of pins."""

    path: Path
    found: dict[Pin, str] = field(default_factory=dict)  # pin -> wheel file name
    missing: list[Pin] = field(default_factory=list)  # no wheel of that name and version
    incompatible: dict[Pin, list[str]] = field(default_factory=dict)  # wheels, none for the target
    present: dict[str, list[str]] = field(default_factory=dict)  # name -> versions the wheelhouse has

    @property
    def ok(self) -> bool:
        return not self.missing and not self.incompatible

    def problems(self) -> list[str]:
        out = []
        for pin in self.missing:
            have = self.present.get(pin.name)
            has = f" (it has {pin.name} {', '.join(have)})" if have else ""
            out.append(f"{pin}: no wheel in {self.path}{has}")
        for pin, files in self.incompatible.items():
            out.append(f"{pin}: {', '.join(files)} is not built for the target (Python/platform)")
        return out

    def raise_for_problems(self, fix: str) -> None:
        if not self.ok:
            raise BadInput(f"wheelhouse {self.path} lacks {'; '.join(self.problems())}: {fix}")


@dataclass
class BundleResult:
    """A built wheelhouse: where, which wheels, how big, how long."""

    path: Path
    files: list[str]
    bytes: int
    seconds: float
    components: list[str] = field(default_factory=list)
    downloaded: int = 0  # wheels fetched by this build
    reused: int = 0  # wheels that were already there

    def to_dict(self) -> dict[str, Any]:
        return {
            "path": str(self.path),
            "files": list(self.files),
            "bytes": self.bytes,
            "seconds": round(self.seconds, 2),
            "components": list(self.components),
            "downloaded": self.downloaded,
            "reused": self.reused,
        }


# --------------------------------------------------------------------------- pure helpers


def _same_version(a: str | Version, b: str | Version) -> bool:
    try:
        return Version(str(a)) == Version(str(b))
    except InvalidVersion:
        return str(a) == str(b)


def manylinux_platforms(glibc: str = DEFAULT_GLIBC, arch: str = DEFAULT_ARCH) -> list[str]:
    """Platform tags a Linux with glibc GLIBC accepts, newest first (for pip --platform)."""
    m = re.fullmatch(r"2\.(\d+)", glibc)
    if not m:
        raise BadInput(f"glibc version {glibc!r} is not like 2.28")
    minor = int(m.group(1))
    if minor < 5:
        raise BadInput(f"glibc {glibc} is older than any manylinux")
    out = [f"manylinux_2_{n}_{arch}" for n in range(minor, 4, -1)]
    legacy = {17: "manylinux2014", 12: "manylinux2010", 5: "manylinux1"}
    out += [f"{tag}_{arch}" for n, tag in legacy.items() if minor >= n]
    return out


def supported_tags(python_version: str = DEFAULT_PYTHON, platforms: Sequence[str] | None = None) -> set[Any]:
    """Wheel tags CPython PYTHON_VERSION accepts on PLATFORMS (like pip's compatibility check)."""
    major, minor = (int(p) for p in python_version.split(".")[:2])
    plats = list(platforms or manylinux_platforms())
    interpreter = f"cp{major}{minor}"
    found = set(_tags.cpython_tags((major, minor), abis=[interpreter, "abi3", "none"], platforms=plats))
    found |= set(_tags.compatible_tags((major, minor), interpreter, plats))
    return found


def parse_wheel(file: str) -> Wheel | None:
    """A wheel file name -> its canonical name, version and tags (None: not a wheel file)."""
    try:
        name, version, _build, wheel_tags = parse_wheel_filename(Path(file).name)
    except (InvalidWheelFilename, InvalidVersion):
        return None
    return Wheel(Path(file).name, str(name), str(version), frozenset(wheel_tags))


def parse_lock(text: str, where: str = "mlstack.lock") -> Lock:
    """The lock's text -> a :class:`Lock`; a malformed pin or two versions of one name are refused."""
    try:
        data = yaml.safe_load(text)
    except yaml.YAMLError as exc:
        raise BadInput(f"{where} is not valid YAML: {exc}") from exc
    if not isinstance(data, Mapping):
        raise BadInput(f"{where} is not a mapping with schema, python_version and components")
    if data.get("schema") != LOCK_SCHEMA:
        raise BadInput(f"{where} has schema {data.get('schema')!r}; this provisioner reads schema {LOCK_SCHEMA}")
    raw = data.get("components")
    if not isinstance(raw, Mapping) or not raw:
        raise BadInput(f"{where} has no components")
    components: dict[str, list[Pin]] = {}
    versions: dict[str, tuple[str, str]] = {}
    for component, pins in raw.items():
        if not isinstance(pins, list):
            raise BadInput(f"{where}: component {component!r} must be a list of NAME==VERSION")
        parsed = []
        for text_pin in pins:
            pin = Pin.parse(text_pin, f"{where}, component {component}: ")
            seen = versions.get(pin.name)
            if seen and not _same_version(seen[0], pin.version):
                raise BadInput(f"{where} pins {pin.name} twice: {pin.name}=={seen[0]} ({seen[1]}) and {pin} ({component})")
            versions.setdefault(pin.name, (pin.version, str(component)))
            parsed.append(pin)
        components[str(component)] = parsed
    requirements = {str(k): [str(r) for r in v] for k, v in (data.get("requirements") or {}).items()}
    lock = Lock(
        python_version=str(data.get("python_version", DEFAULT_PYTHON)),
        glibc=str(data.get("glibc", DEFAULT_GLIBC)),
        arch=str(data.get("arch", DEFAULT_ARCH)),
        requirements=requirements,
        components=components,
    )
    manylinux_platforms(lock.glibc, lock.arch)  # a bad glibc is refused here
    return lock


def load_lock(path: Path | str = DEFAULT_LOCK) -> Lock:
    path = Path(path)
    try:
        text = path.read_text()
    except OSError as exc:
        raise BadInput(
            f"cannot read the lock {path}: {exc.strerror}; regenerate it with `provisioner bundle --update-lock`"
        ) from exc
    return parse_lock(text, str(path))


def select_components(components: Iterable[str], known: Iterable[str] = COMPONENTS) -> list[str]:
    """The components to install, core included, in a stable order; an unknown name is refused."""
    known = list(known)
    chosen = [str(c).strip() for c in components if str(c).strip()]
    unknown = [c for c in chosen if c not in known]
    if unknown:
        raise BadInput(f"unknown component {', '.join(unknown)}; known: {', '.join(known)}")
    wanted = set(chosen) | {c for c in ALWAYS if c in known}
    return [c for c in known if c in wanted]


def select_pins(lock: Lock, components: Iterable[str]) -> list[Pin]:
    """The pins of COMPONENTS (core included), each name once, sorted by name."""
    chosen = select_components(components, known=list(dict.fromkeys([*COMPONENTS, *lock.components])))
    missing = [c for c in chosen if c not in lock.components]
    if missing:
        raise BadInput(f"the lock has no component {', '.join(missing)}; it has {', '.join(lock.components)}: regenerate it")
    out: dict[str, Pin] = {}
    for component in chosen:
        for pin in lock.components[component]:
            out.setdefault(pin.name, pin)
    return sorted(out.values())


def validate_wheelhouse(
    path: Path | str,
    pins: Iterable[Pin],
    *,
    files: Iterable[str] | None = None,
    python_version: str = DEFAULT_PYTHON,
    platforms: Sequence[str] | None = None,
) -> WheelhouseCheck:
    """Does the wheelhouse hold a wheel for every pin, built for the target?  FILES overrides the
    directory listing (names only)."""
    path = Path(path)
    if files is None:
        files = sorted(p.name for p in path.glob("*.whl")) if path.is_dir() else []
    wheels = [w for w in (parse_wheel(f) for f in files) if w is not None]
    tags = supported_tags(python_version, platforms)
    check = WheelhouseCheck(path)
    for w in wheels:
        check.present.setdefault(w.name, [])
        if w.version not in check.present[w.name]:
            check.present[w.name].append(w.version)
    for pin in pins:
        candidates = [w for w in wheels if pin.matches(w.name, w.version)]
        usable = [w for w in candidates if w.tags & tags]
        if usable:
            check.found[pin] = sorted(w.file for w in usable)[0]
        elif candidates:
            check.incompatible[pin] = sorted(w.file for w in candidates)
        else:
            check.missing.append(pin)
    return check


def marker_environment(python_version: str = DEFAULT_PYTHON, arch: str = DEFAULT_ARCH) -> dict[str, str]:
    """The PEP 508 marker values of the target: CPython PYTHON_VERSION on Linux ARCH."""
    return {
        "implementation_name": "cpython",
        "implementation_version": f"{python_version}.0",
        "os_name": "posix",
        "platform_machine": arch,
        "platform_python_implementation": "CPython",
        "platform_system": "Linux",
        "python_full_version": f"{python_version}.0",
        "python_version": python_version,
        "sys_platform": "linux",
    }


def closures(
    report: Mapping[str, Any], requirements: Mapping[str, Sequence[str]], environment: Mapping[str, str]
) -> dict[str, list[Pin]]:
    """Each component's pinned closure, from a ``pip install --dry-run --report`` of all of them.

    For every component the requirements are followed through the report's ``requires_dist``
    (markers evaluated for ENVIRONMENT, extras carried along) to the packages pip chose.
    """
    by_name: dict[str, Mapping[str, Any]] = {}
    for item in report.get("install", []):
        meta = item["metadata"]
        by_name[canonicalize_name(meta["name"])] = meta

    def deps(name: str, extras: frozenset[str]) -> list[Requirement]:
        out = []
        for spec in by_name[name].get("requires_dist") or []:
            req = Requirement(spec)
            if req.marker is None or _marker_true(req.marker, environment, extras):
                out.append(req)
        return out

    result: dict[str, list[Pin]] = {}
    for component, reqs in requirements.items():
        seen: dict[str, set[str]] = {}
        queue = [Requirement(r) for r in reqs]
        while queue:
            req = queue.pop()
            name = canonicalize_name(req.name)
            if name not in by_name:
                raise BadInput(f"pip's report lacks {req.name}, needed by component {component}")
            extras = set(req.extras)
            if name in seen and extras <= seen[name]:
                continue
            seen.setdefault(name, set()).update(extras)
            queue.extend(deps(name, frozenset(seen[name])))
        result[component] = sorted(Pin(n, str(by_name[n]["version"])) for n in seen)
    return result


def _marker_true(marker: Marker, environment: Mapping[str, str], extras: frozenset[str]) -> bool:
    return any(marker.evaluate({**environment, "extra": extra}) for extra in extras or {""})


def render_lock(lock: Lock) -> str:
    """The lock as the file holds it: a header saying how to regenerate it, then YAML."""
    header = (
        "# The ML stack of roles/mlstack, every package pinned (transitive dependencies included),\n"
        f"# per component, for CPython {lock.python_version} on Linux {lock.arch} with glibc {lock.glibc} or newer\n"
        f"# (manylinux_{lock.glibc.replace('.', '_')} and older wheels).\n"
        "# Generated from `requirements` below by pip's resolver; do not edit the pins by hand.\n"
        "# To change a component, edit its requirements here and regenerate (the existing pins are\n"
        "# kept; add --upgrade to pin everything afresh):\n"
        "#   .venv/bin/provisioner bundle --update-lock\n"
        "# then rebuild wheelhouses (provisioner bundle).\n"
    )
    body = {
        "schema": LOCK_SCHEMA,
        "python_version": lock.python_version,
        "glibc": lock.glibc,
        "arch": lock.arch,
        "requirements": {k: list(v) for k, v in lock.requirements.items()},
        "components": {k: [str(p) for p in v] for k, v in lock.components.items()},
    }
    return header + yaml.safe_dump(body, sort_keys=False, default_flow_style=False, width=100)


def missing_package(pip_output: str) -> str | None:
    """The requirement pip named when it found no distribution for it."""
    found = _NO_MATCH_RE.findall(pip_output)
    return found[-1] if found else None


# --------------------------------------------------------------------------- pip


def _pip_target_args(python_version: str, platforms: Sequence[str]) -> list[str]:
    major, minor = python_version.split(".")[:2]
    args = ["--only-binary=:all:", "--python-version", f"{major}.{minor}", "--implementation", "cp", "--abi", f"cp{major}{minor}"]
    for plat in platforms:
        args += ["--platform", plat]
    return args


def _index_args(index_url: str | None, extra_index_urls: Sequence[str]) -> list[str]:
    args = ["--index-url", index_url] if index_url else []
    for url in extra_index_urls:
        args += ["--extra-index-url", url]
    return args


def _run_pip(args: list[str], what: str, timeout: float) -> subprocess.CompletedProcess[str]:
    cmd = [sys.executable, "-m", "pip", "--disable-pip-version-check", *args]
    return run(cmd, f"pip could not {what}", "check the network and the indexes", check=False, timeout=timeout)


def _pip_failed(r: subprocess.CompletedProcess[str], what: str, python_version: str, platform: str, fix: str = "") -> NoReturn:
    """A failed pip run: a missing wheel is bad input naming the package, anything else pip's last lines."""
    output = r.stdout + r.stderr
    name = missing_package(output)
    if name:
        raise BadInput(
            f"pip found no wheel for {name} (CPython {python_version}, {platform} or older)" + (f": {fix}" if fix else "")
        )
    tail = "; ".join(ln.strip() for ln in output.strip().splitlines()[-3:])
    raise ProvisionerError(f"{what}: {tail}")


def build_wheelhouse(
    dest: Path | str,
    components: Sequence[str],
    *,
    lock_path: Path | str = DEFAULT_LOCK,
    python_version: str = DEFAULT_PYTHON,
    platforms: Sequence[str] | None = None,
    index_url: str | None = None,
    extra_index_urls: Sequence[str] = (),
    torch_index_url: str | None = None,
    timeout: float = 1800,
) -> BundleResult:
    """Download the wheels of COMPONENTS (core included) into DEST for the target's Python and
    platform; wheels already in DEST are reused, so a second build downloads nothing.

    pip runs ``download --only-binary=:all: --no-deps`` with the lock's pins (the lock is
    complete, so no resolution happens here).  torch, torchvision and torchaudio come from
    TORCH_INDEX_URL when it is given (https://download.pytorch.org/whl/cpu for CPU builds),
    else from the same indexes as the rest (pip's configured ones, INDEX_URL, EXTRA_INDEX_URLS).
    Writes DEST/wheelhouse.json (components, pins, files).  A package pip cannot find, or a pin
    without a wheel afterwards, raises BadInput naming it.
    """
    started = time.monotonic()
    dest = Path(dest).resolve()
    lock = load_lock(lock_path)
    if lock.python_version != python_version:
        raise BadInput(
            f"the lock {lock_path} is resolved for Python {lock.python_version}, not {python_version}: "
            f"regenerate it with Python {python_version} (provisioner bundle --update-lock)"
        )
    plats = list(platforms or lock.platforms)
    chosen = select_components(components, known=list(dict.fromkeys([*COMPONENTS, *lock.components])))
    pins = select_pins(lock, chosen)
    fix = "fix the pin in the lock, or check that the index serves it for this Python and platform"
    with locked(dest / ".lock"):
        before = validate_wheelhouse(dest, pins, python_version=python_version, platforms=plats)
        todo = before.missing + list(before.incompatible)
        groups: list[tuple[list[Pin], list[str]]] = []
        if todo:
            from_torch = [p for p in todo if torch_index_url and p.name in TORCH_INDEX_PACKAGES]
            rest = [p for p in todo if p not in from_torch]
            if rest:
                groups.append((rest, _index_args(index_url, extra_index_urls)))
            if from_torch:
                groups.append((from_torch, _index_args(torch_index_url, ())))
        for group, index_args in groups:
            with tempfile.NamedTemporaryFile("w", suffix=".txt", prefix="mlstack-pins-") as req:
                req.write("".join(f"{p}\n" for p in group))
                req.flush()
                r = _run_pip(
                    [
                        "download",
                        "--no-deps",
                        "--dest",
                        str(dest),
                        *_pip_target_args(python_version, plats),
                        *index_args,
                        "-r",
                        req.name,
                    ],
                    "download the wheelhouse",
                    timeout,
                )
            if r.returncode != 0:
                _pip_failed(r, f"pip download failed ({r.returncode}) for the wheelhouse {dest}", python_version, plats[0], fix)
        after = validate_wheelhouse(dest, pins, python_version=python_version, platforms=plats)
        after.raise_for_problems(fix)
        files = [after.found[p] for p in pins]
        size = sum((dest / f).stat().st_size for f in files)
        manifest = {
            "schema": LOCK_SCHEMA,
            "python_version": python_version,
            "platforms": plats,
            "components": chosen,
            "pins": [str(p) for p in pins],
            "files": {f: (dest / f).stat().st_size for f in files},
        }
        tmp = dest / f".{MANIFEST}.tmp"
        tmp.write_text(json.dumps(manifest, indent=1) + "\n")
        os.replace(tmp, dest / MANIFEST)
    return BundleResult(
        path=dest,
        files=files,
        bytes=size,
        seconds=time.monotonic() - started,
        components=chosen,
        downloaded=len(todo),
        reused=len(pins) - len(todo),
    )


def generate_lock(
    output: Path | str | None = DEFAULT_LOCK,
    requirements: Mapping[str, Sequence[str]] | None = None,
    *,
    python_version: str = DEFAULT_PYTHON,
    glibc: str = DEFAULT_GLIBC,
    arch: str = DEFAULT_ARCH,
    index_url: str | None = None,
    extra_index_urls: Sequence[str] = (),
    torch_index_url: str | None = None,
    timeout: float = 1800,
    upgrade: bool = False,
) -> Lock:
    """Resolve REQUIREMENTS (component -> requirement strings; default: the existing lock's,
    else DEFAULT_REQUIREMENTS) together with pip's resolver for the target, then write each
    component's pinned closure to OUTPUT (None: don't write).

    The existing lock's pins are kept as constraints, so adding a requirement pins only what
    it brings (as pip-tools keeps pins); `upgrade` resolves every package afresh.

    pip evaluates environment markers for the Python running it, so run this with the target's
    Python version (3.11 for Debian 12).
    """
    running = f"{sys.version_info.major}.{sys.version_info.minor}"
    if running != python_version:
        raise BadInput(
            f"generate the lock for Python {python_version} with Python {python_version} (this is {running}): "
            "pip evaluates markers for the running interpreter"
        )
    existing = Path(output) if output else None
    previous = load_lock(existing) if existing and existing.exists() else None
    if requirements is None:
        requirements = previous.requirements if previous else DEFAULT_REQUIREMENTS
    wanted = {k: list(v) for k, v in requirements.items()}
    select_components(wanted, known=list(dict.fromkeys([*COMPONENTS, *wanted])))
    plats = manylinux_platforms(glibc, arch)
    all_reqs = list(dict.fromkeys(r for reqs in wanted.values() for r in reqs))
    extra = [*extra_index_urls, *([torch_index_url] if torch_index_url else [])]
    with tempfile.TemporaryDirectory(prefix="mlstack-lock-") as tmp:
        req_file = Path(tmp) / "requirements.txt"
        req_file.write_text("".join(f"{r}\n" for r in all_reqs))
        constraints: list[str] = []
        if previous and not upgrade:
            kept = Path(tmp) / "constraints.txt"
            kept.write_text("".join(f"{pin}\n" for pin in constraint_lines(previous)))
            constraints = ["--constraint", str(kept)]
        report_file = Path(tmp) / "report.json"
        r = _run_pip(
            [
                "install",
                "--dry-run",
                "--ignore-installed",
                "--quiet",
                "--target",
                str(Path(tmp) / "target"),
                "--report",
                str(report_file),
                *_pip_target_args(python_version, plats),
                *_index_args(index_url, extra),
                "-r",
                str(req_file),
                *constraints,
            ],
            "resolve the lock",
            timeout,
        )
        if r.returncode != 0:
            _pip_failed(r, f"pip could not resolve the ML stack ({r.returncode})", python_version, plats[0])
        report = json.loads(report_file.read_text())
    lock = Lock(
        python_version=python_version,
        glibc=glibc,
        arch=arch,
        requirements=wanted,
        components=closures(report, wanted, marker_environment(python_version, arch)),
    )
    if output:
        out = Path(output)
        out.parent.mkdir(parents=True, exist_ok=True)
        tmp_out = out.with_name(f".{out.name}.tmp")
        tmp_out.write_text(render_lock(lock))
        os.replace(tmp_out, out)
    return lock


def constraint_lines(lock: Lock) -> list[str]:
    """Every pin of the lock once, as pip constraints (NAME==VERSION)."""
    return sorted({f"{pin.name}=={pin.version}" for pins in lock.components.values() for pin in pins})


def default_wheelhouse() -> Path:
    """Where builds are cached on the control node: /var/cache/provisioner/wheelhouse."""
    return paths.cache_dir() / "wheelhouse"

"""Compiled Jinja code shared by every worker of one ansible-playbook run, and the Jinja plugins
resolved once in the parent.

ansible-core 2.19 compiles each template and condition from its text again wherever it is
rendered, and Ansible forks one worker per task and host: whatever a worker compiles or loads
dies with it, so the same `when:` or role default is compiled again in the next task's worker
(about 4-5 ms each, parse, code generation and Python's compile), and each worker loads the
filter and test plugin files again before its first filter.

What is cached is Jinja's compiled *code*, never a rendered result: a template is still built
per environment from it (`Template.from_code`, what Jinja's own bytecode cache does), so
variables, undefined handling and the sandbox behave as before. The key is the template's text
and every setting that changes what Jinja generates for it: the environment's class and code
generator, its delimiters and whitespace settings (a `#jinja2:` header's overrides included),
optimizer, async mode, extensions and finalize function, whether Ansible escapes backslashes in
the expression being compiled (on for task arguments, off for conditions), whether embedded
templates are allowed, the Jinja and Python versions, and a generation that moves whenever a
filter or test plugin directory is added (the code Jinja generates for a filter depends on the
plugin it finds). Code compiled in the parent is inherited by every fork; code a worker
compiles is also written, marshalled, to a directory private to this run (created by the
parent, mode 0700, removed when the parent exits), where the next workers read it.

With $PROVISIONER_TEMPLATE_CACHE_DIR (the CLI sets it under its cache directory) that directory
is kept across runs instead, so a re-run compiles nothing it compiled before. A counter of
plugin directories means nothing to another process, so there the key holds a fingerprint of
the plugins instead: ansible-core's version, every file (name, size, mtime) in the filter and
test plugin directories searched, and the top files of every collection installed. The
directory is used only when it is this user's own and nobody else may write to it, and is
emptied when it holds more than MAX_STORED files.

Fail-safe by construction: anything not cached (a compile error, Ansible's template debugging,
raw source, an unreadable or partial file) goes through Jinja's own code path as before.
"""

from __future__ import annotations

import atexit
import contextlib
import contextvars
import hashlib
import marshal
import os
import shutil
import stat
import sys
import tempfile
import typing as t

import jinja2
from ansible import release as ansible_release
from ansible._internal._templating import _jinja_bits
from ansible._internal._templating._jinja_bits import AnsibleEnvironment
from ansible._internal._templating._jinja_common import _TemplateConfig
from ansible.plugins import loader as plugin_loader
from jinja2.environment import TemplateExpression
from jinja2.nodes import Template as TemplateNode

# The environment attributes Jinja's lexer, parser and code generator read (Jinja 3.1).
_LEXER_SETTINGS = (
    "block_start_string",
    "block_end_string",
    "variable_start_string",
    "variable_end_string",
    "comment_start_string",
    "comment_end_string",
    "line_statement_prefix",
    "line_comment_prefix",
    "trim_blocks",
    "lstrip_blocks",
    "newline_sequence",
    "keep_trailing_newline",
)

# Entries kept in memory per process; a no-op site.yml run compiles a few hundred distinct texts.
MAX_ENTRIES = 20000

# Files kept in a directory that outlives the runs, before it is emptied.
MAX_STORED = 50000
STORE_ENV = "PROVISIONER_TEMPLATE_CACHE_DIR"

_codes: dict[tuple, t.Any] = {}
_store: str | None = None  # the run's directory of marshalled code (None: memory only)
_persistent = False  # _store outlives the run: keys name the plugins, not a per-process counter
_owner_pid: int | None = None
_plugin_generation = 0
_fingerprints: dict[int, str] = {}
_expression_key: contextvars.ContextVar[tuple | None] = contextvars.ContextVar("provisioner_expression_key", default=None)
_original: dict[str, t.Callable] = {}

stats = {"hits": 0, "file_hits": 0, "misses": 0}


def _name(obj: t.Any) -> str:
    return f"{getattr(obj, '__module__', '')}.{getattr(obj, '__qualname__', type(obj).__qualname__)}"


def settings(env: jinja2.Environment) -> tuple:
    """Everything of env and of the moment that changes the code Jinja generates for one text."""
    compile_context = _jinja_bits._TemplateCompileContext.current(optional=True)
    autoescape = env.autoescape
    return (
        _name(type(env)),
        _name(env.code_generator_class),
        tuple(getattr(env, name) for name in _LEXER_SETTINGS),
        env.optimized,
        env.is_async,
        _name(autoescape) if callable(autoescape) else autoescape,
        tuple(sorted(env.extensions)),
        _name(env.finalize) if env.finalize is not None else None,
        None if compile_context is None else compile_context.escape_backslashes,
        _TemplateConfig.allow_embedded_templates,
        plugin_fingerprint() if _persistent else _plugin_generation,
        jinja2.__version__,
        sys.version_info[:2],
    )


def plugin_fingerprint() -> str:
    """The filter and test plugins Jinja's code generator may resolve, as of this plugin generation."""
    known = _fingerprints.get(_plugin_generation)
    if known is not None:
        return known
    digest = hashlib.sha256(ansible_release.__version__.encode())
    paths: list[str] = []
    for jinja_loader in (plugin_loader.filter_loader, plugin_loader.test_loader):
        with contextlib.suppress(Exception):
            paths += jinja_loader._get_paths()
    with contextlib.suppress(Exception):
        from ansible.utils.collection_loader import AnsibleCollectionConfig

        for root in AnsibleCollectionConfig.collection_paths or []:
            base = os.path.join(root, "ansible_collections")
            with contextlib.suppress(OSError):
                for namespace in sorted(os.listdir(base)):
                    with contextlib.suppress(OSError):
                        paths += [os.path.join(base, namespace, name) for name in sorted(os.listdir(os.path.join(base, namespace)))]
    for path in paths:
        digest.update(path.encode("utf-8", "surrogatepass") + b"\0")
        with contextlib.suppress(OSError):
            for entry in sorted(os.scandir(path), key=lambda e: e.name):
                if entry.name.endswith((".py", ".yml", ".yaml", ".json")) and entry.is_file():
                    st = entry.stat()
                    digest.update(f"{entry.name}:{st.st_size}:{st.st_mtime_ns}\0".encode("utf-8", "surrogatepass"))
    known = _fingerprints[_plugin_generation] = digest.hexdigest()[:32]
    return known


def _lookup(key: tuple) -> t.Any:
    code = _codes.get(key)
    if code is not None:
        stats["hits"] += 1
        return code
    if _store is None:
        return None
    try:
        with open(_path(key), "rb") as f:
            code = marshal.load(f)
    except (OSError, EOFError, ValueError, TypeError):
        return None
    stats["file_hits"] += 1
    _remember(key, code)
    return code


def _remember(key: tuple, code: t.Any) -> None:
    if len(_codes) >= MAX_ENTRIES:
        _codes.clear()
    _codes[key] = code


def _save(key: tuple, code: t.Any) -> None:
    stats["misses"] += 1
    _remember(key, code)
    if _store is None:
        return
    target = _path(key)
    partial = f"{target}.{os.getpid()}.partial"
    try:
        with open(partial, "wb") as f:
            marshal.dump(code, f)
        os.replace(partial, target)  # whole or absent: a reader never sees half a file
    except OSError:
        with contextlib.suppress(OSError):
            os.unlink(partial)


def _path(key: tuple) -> str:
    assert _store is not None
    return os.path.join(_store, hashlib.sha256(repr(key).encode("utf-8", "surrogatepass")).hexdigest())


def _plain(text: str) -> str:
    # Ansible's tagged strings (origin, trust) compare as their text; the key keeps the text only.
    return str.__str__(text)


def _compile(self, source, name=None, filename=None, raw=False, defer_init=False):
    original = _original["compile"]
    if raw or self._debuggable_template_source:
        return original(self, source, name, filename, raw, defer_init)
    key: tuple | None
    if isinstance(source, str):
        key = ("template", _plain(source), name, filename, defer_init, settings(self))
    else:
        key = _expression_key.get()
        _expression_key.set(None)  # one expression, one compile: nothing nested reuses the key
        if key is None or not isinstance(source, TemplateNode):
            return original(self, source, name, filename, raw, defer_init)
        key = (*key, name, filename, defer_init)
    code = _lookup(key)
    if code is None:
        code = original(self, source, name, filename, raw, defer_init)
        _save(key, code)
    return code


def _compile_expression(self, source, undefined_to_none=True):
    original = _original["compile_expression"]
    if self._debuggable_template_source or not isinstance(source, str):
        return original(self, source, undefined_to_none)
    key = ("expression", _plain(source), bool(undefined_to_none), settings(self))
    code = _lookup((*key, None, None, False))
    if code is not None:
        # What Jinja's compile_expression builds from the same code, minus the parse.
        template = self.template_class.from_code(self, code, self.make_globals(None), None)
        return TemplateExpression(template, undefined_to_none)
    token = _expression_key.set(key)
    try:
        return original(self, source, undefined_to_none)
    finally:
        _expression_key.reset(token)


def _clear_plugin_caches(self):
    global _plugin_generation
    _plugin_generation += 1
    return _original["clear_caches"](self)


def install() -> None:
    """Route AnsibleEnvironment's compiles through the cache (memory only until share() is called)."""
    if _original:
        return
    _original["compile"] = AnsibleEnvironment.compile
    _original["compile_expression"] = AnsibleEnvironment.compile_expression
    _original["clear_caches"] = plugin_loader.Jinja2Loader._clear_caches
    AnsibleEnvironment.compile = _compile
    AnsibleEnvironment.compile_expression = _compile_expression
    plugin_loader.Jinja2Loader._clear_caches = _clear_plugin_caches


def uninstall() -> None:
    if not _original:
        return
    AnsibleEnvironment.compile = _original.pop("compile")
    AnsibleEnvironment.compile_expression = _original.pop("compile_expression")
    plugin_loader.Jinja2Loader._clear_caches = _original.pop("clear_caches")
    _codes.clear()


def share(directory: str | None = None) -> str:
    """Give this process's forks a directory to hand each other compiled code: DIRECTORY (else
    $PROVISIONER_TEMPLATE_CACHE_DIR), kept across runs, when it is private to this user; else
    one of this run's own, removed at exit."""
    global _store, _owner_pid, _persistent
    if _store is None:
        directory = directory or os.environ.get(STORE_ENV)
        if directory and _private(directory):
            _store, _persistent = directory, True
        else:
            _store = tempfile.mkdtemp(prefix="provisioner-jinja-")
            _owner_pid = os.getpid()
            atexit.register(_remove_store)
    return _store


def _private(directory: str) -> bool:
    """DIRECTORY exists or was made (mode 0700), is a directory of this user's that no one else may
    write to (marshalled code is run as it is read), and is emptied when it grew past MAX_STORED."""
    try:
        os.makedirs(directory, mode=0o700, exist_ok=True)
        st = os.lstat(directory)
        if not stat.S_ISDIR(st.st_mode) or st.st_uid != os.geteuid() or st.st_mode & 0o022:
            return False
        names = os.listdir(directory)
        if len(names) > MAX_STORED:
            for name in names:
                with contextlib.suppress(OSError):
                    os.unlink(os.path.join(directory, name))
    except OSError:
        return False
    return True


def _remove_store() -> None:
    global _store, _persistent
    if _persistent:
        _store, _persistent = None, False  # kept for the next run
    elif _store is not None and os.getpid() == _owner_pid:
        shutil.rmtree(_store, ignore_errors=True)
        _store = None


def warm_plugins() -> None:
    """Load the filter and test plugin files once here, before a fork, instead of in every worker.

    Jinja2Loader keeps its table of the plugins found on its paths (the builtin ones, the
    project's filter_plugins) per process and fills it at its first look-up, which in a run is
    mostly a worker's: each worker read and imported the plugin files again. Filling it in the
    parent is what the first look-up does anyway (and it is filled again, by the same code,
    after a plugin directory is added); a failure is left to the worker's own look-up.
    """
    for jinja_loader in (plugin_loader.filter_loader, plugin_loader.test_loader):
        # A failure here is left to the worker's own look-up, which reports it as before.
        with contextlib.suppress(Exception):
            jinja_loader._ensure_non_collection_wrappers()

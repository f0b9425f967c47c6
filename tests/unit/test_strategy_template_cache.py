"""The compiled-code cache the strategy plugin installs (plugins/strategy/_template_cache.py),
with ansible-core's real Templar: a cached template renders as an uncached one, a setting that
changes what Jinja generates gives other code, and code a forked worker compiled reaches the
next one through the run's directory."""

from __future__ import annotations

import importlib.util
import os
import sys
from pathlib import Path

import pytest
from ansible._internal._templating._jinja_bits import AnsibleEnvironment
from ansible.plugins import loader as plugin_loader
from ansible.template import Templar, trust_as_template

STRATEGY = Path(__file__).resolve().parents[2] / "plugins" / "strategy"
VARIABLES = {"name": "db", "port": 5432, "items": [3, 1, 2], "path": "a\\b", "enabled": True}
TEMPLATES = [
    "{{ name | upper }}-{{ port + 1 }}",
    "{{ items | sort | join(',') }}",
    "{% for i in items %}[{{ i }}]{% endfor %}",
    "{{ path }} {{ 'c\\nd' }}",
    "#jinja2: variable_start_string:'[[', variable_end_string:']]'\n[[ name ]] {{ name }}",
    "{{ undefined_thing | default('fallback') }}",
]
CONDITIONS = ["enabled", "port > 5000 and name is match('d')", "items | length == 3", "'b' in path"]


@pytest.fixture
def cache():
    name = "provisioner_strategy_template_cache"
    spec = importlib.util.spec_from_file_location(name, STRATEGY / "_template_cache.py")
    assert spec is not None and spec.loader is not None
    module = importlib.util.module_from_spec(spec)
    sys.modules[name] = module
    spec.loader.exec_module(module)
    module.install()
    yield module
    module.uninstall()
    module._remove_store()
    sys.modules.pop(name, None)


def render_all() -> list:
    """Every template and condition rendered by a new Templar (a new environment, as in a worker)."""
    templar = Templar(variables=VARIABLES)
    rendered = [templar.template(trust_as_template(text)) for text in TEMPLATES]
    return rendered + [templar.evaluate_conditional(trust_as_template(text)) for text in CONDITIONS]


def test_cached_code_renders_as_jinja_compiled_it(cache) -> None:
    cache.uninstall()
    uncached = render_all()
    cache.install()
    first = render_all()
    assert cache.stats["misses"] >= len(TEMPLATES) + len(CONDITIONS) and cache.stats["hits"] == 0
    second = render_all()
    assert cache.stats["hits"] >= len(TEMPLATES) + len(CONDITIONS)
    assert first == second == uncached
    assert uncached[0] == "DB-5433" and uncached[4] == "db {{ name }}" and uncached[-1] is True


def test_a_setting_that_changes_compilation_changes_the_code(cache) -> None:
    env = AnsibleEnvironment()
    text = "[[ x ]]{{ x }}"
    default = env.compile(text)
    overlaid = env.overlay(variable_start_string="[[", variable_end_string="]]")
    other = overlaid.compile(text)
    assert (other.co_code, other.co_consts) != (default.co_code, default.co_consts)
    assert env.compile(text) is default and overlaid.compile(text) is other
    # The same through the Templar: the text after a #jinja2: header renders with its own delimiters.
    templar = Templar(variables={"x": 1})
    assert templar.template(trust_as_template(text)) == "[[ x ]]1"
    header = "#jinja2: variable_start_string:'[[', variable_end_string:']]'\n"
    assert templar.template(trust_as_template(header + text)) == "1{{ x }}"
    assert templar.template(trust_as_template(text)) == "[[ x ]]1"


def test_backslash_escaping_keys_its_own_code(cache) -> None:
    # Task arguments escape backslashes in {{ }} string constants, conditions do not: same text, two codes.
    templar = Templar(variables=VARIABLES)
    text = trust_as_template("{{ 'a\\tb' }}")
    escaped = templar.template(text)
    unescaped = templar.template(text, escape_backslashes=False)
    assert escaped == "a\\tb" and unescaped == "a\tb"
    assert templar.template(text) == escaped and templar.template(text, escape_backslashes=False) == unescaped


def test_an_added_plugin_directory_retires_the_code(cache, tmp_path: Path) -> None:
    env = AnsibleEnvironment()
    code = env.compile("{{ 1 | string }}")
    (tmp_path / "filter_plugins").mkdir()
    plugin_loader.filter_loader.add_directory(str(tmp_path / "filter_plugins"))
    try:
        assert env.compile("{{ 1 | string }}") is not code
    finally:
        plugin_loader.filter_loader._extra_dirs.remove(str(tmp_path / "filter_plugins"))
        plugin_loader.filter_loader._clear_caches()


def test_a_syntax_error_is_not_cached_and_still_reported(cache) -> None:
    templar = Templar(variables=VARIABLES)
    for _ in range(2):
        with pytest.raises(Exception, match=r"[Ss]yntax error"):
            templar.template(trust_as_template("{{ name | }}"))
    assert cache.stats["hits"] == 0 and not cache._codes


def test_a_forked_worker_hands_its_code_to_the_next(cache) -> None:
    cache.share()
    expected = render_all()
    cache._codes.clear()
    cache._remove_store()
    store = cache.share()  # a fresh directory: nothing compiled in this process is in it
    cache._codes.clear()
    pid = os.fork()
    if pid == 0:  # the first worker compiles and writes
        os._exit(0 if render_all() == expected and cache.stats["misses"] else 1)
    assert os.waitpid(pid, 0)[1] == 0
    assert len(os.listdir(store)) >= len(TEMPLATES) + len(CONDITIONS)
    assert not cache._codes  # the parent compiled nothing itself
    before = dict(cache.stats)
    assert render_all() == expected  # the next process reads the worker's code
    assert cache.stats["file_hits"] - before["file_hits"] >= len(TEMPLATES) + len(CONDITIONS)
    assert cache.stats["misses"] == before["misses"]
    # A partial or foreign file is never code: it is compiled again.
    for entry in os.listdir(store):
        Path(store, entry).write_bytes(b"\x00")
    cache._codes.clear()
    assert render_all() == expected


def test_the_store_is_removed_with_its_process(cache) -> None:
    store = cache.share()
    cache._remove_store()
    assert not os.path.exists(store)


def test_a_private_directory_keeps_the_code_for_the_next_run(cache, tmp_path: Path) -> None:
    store = tmp_path / "jinja"
    assert cache.share(str(store)) == str(store) and cache._persistent
    expected = render_all()
    assert len(os.listdir(store)) >= len(TEMPLATES) + len(CONDITIONS)
    # The next run: a new process (nothing in memory, the generation counter back at 0).
    cache._remove_store()
    assert store.is_dir(), "kept across runs"
    cache._codes.clear()
    cache._fingerprints.clear()
    cache.share(str(store))
    before = dict(cache.stats)
    assert render_all() == expected
    assert cache.stats["misses"] == before["misses"], "compiled nothing it compiled before"
    assert cache.stats["file_hits"] - before["file_hits"] >= len(TEMPLATES) + len(CONDITIONS)


def test_a_plugin_file_changed_between_runs_changes_the_key(cache, tmp_path: Path) -> None:
    plugins = tmp_path / "filter_plugins"
    plugins.mkdir()
    plugin_loader.filter_loader.add_directory(str(plugins))
    try:
        first = cache.plugin_fingerprint()
        assert cache.plugin_fingerprint() == first
        (plugins / "mine.py").write_text("class FilterModule:\n    def filters(self):\n        return {}\n")
        cache._fingerprints.clear()  # a new run
        assert cache.plugin_fingerprint() != first
    finally:
        plugin_loader.filter_loader._extra_dirs.remove(str(plugins))
        plugin_loader.filter_loader._clear_caches()


def test_a_directory_others_may_write_to_is_not_used(cache, tmp_path: Path) -> None:
    shared = tmp_path / "open"
    shared.mkdir()
    shared.chmod(0o777)
    store = cache.share(str(shared))
    assert store != str(shared) and not cache._persistent  # this run's own directory instead
    assert (os.stat(store).st_mode & 0o777) == 0o700

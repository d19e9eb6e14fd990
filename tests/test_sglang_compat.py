"""kgen's SGLang adapter (kgen/integrations/sglang_compat.py).

- Against each supported release's own source: every name in sglang_names.NAMES that release's
  bridge uses exists there (a module attribute, a class attribute or method, a dataclass field,
  or an attribute a method sets on `self`) and takes the parameters kgen passes. The source is
  read with `ast` from the release's wheel, never imported, so CI needs no GPU stack: .ci/run
  downloads the three wheels (`pip download --no-deps`) into $KGEN_SGLANG_WHEELS.
- The checks themselves, without SGLang: an unsupported version, a missing name and a changed
  parameter each give one line naming it and the supported versions; the plugin entry point
  logs that line instead of raising.
"""

from __future__ import annotations

import ast
import functools
import logging
import os
import zipfile
from pathlib import Path

import pytest

from kgen.integrations import sglang as integration
from kgen.integrations import sglang_compat as compat
from kgen.integrations.sglang_compat import SUPPORTED, Name, SGLangError

WHEELS = Path(os.environ.get("KGEN_SGLANG_WHEELS", Path(__file__).resolve().parents[1] / ".sglang_wheels"))


class Source:
    """The Python modules of one sglang wheel, parsed on demand."""

    def __init__(self, wheel: Path):
        self.zip = zipfile.ZipFile(wheel)
        self.files = set(self.zip.namelist())

    @functools.cache
    def module(self, dotted: str) -> ast.Module | None:
        base = dotted.replace(".", "/")
        for path in (f"{base}.py", f"{base}/__init__.py"):
            if path in self.files:
                return ast.parse(self.zip.read(path))
        return None

    def lookup(self, module: str, name: str, depth: int = 0):
        """The def/class/assignment node binding `name` at `module`'s top level (through
        `from x import name` re-exports), or None."""
        tree = self.module(module)
        if tree is None or depth > 5:
            return None
        for node in _statements(tree.body):
            if isinstance(node, (ast.FunctionDef, ast.AsyncFunctionDef, ast.ClassDef)) and node.name == name:
                return node, module
            if isinstance(node, (ast.Assign, ast.AnnAssign)) and name in _targets(node):
                return node, module
            if isinstance(node, ast.ImportFrom) and any((a.asname or a.name) == name for a in node.names):
                alias = next(a for a in node.names if (a.asname or a.name) == name)
                return self.lookup(_absolute(module, node), alias.name, depth + 1)
        return None

    def member(self, module: str, cls: ast.ClassDef, attr: str, depth: int = 0):
        """`attr` of class `cls` (defined in `module`): in its body, set on `self` in one of its
        methods, or inherited from a base class this source defines."""
        for node in _statements(cls.body):
            if isinstance(node, (ast.FunctionDef, ast.AsyncFunctionDef, ast.ClassDef)) and node.name == attr:
                return node
            if isinstance(node, (ast.Assign, ast.AnnAssign)) and attr in _targets(node):
                return node
        for node in ast.walk(cls):
            if isinstance(node, (ast.Assign, ast.AnnAssign)) and any(
                    isinstance(t, ast.Attribute) and t.attr == attr and isinstance(t.value, ast.Name)
                    and t.value.id == "self" for t in _target_nodes(node)):
                return node
        for base in cls.bases:
            if isinstance(base, ast.Name) and depth < 8:
                found = self.lookup(module, base.id)
                if found and isinstance(found[0], ast.ClassDef):
                    hit = self.member(found[1], found[0], attr, depth + 1)
                    if hit is not None:
                        return hit
        return None

    def find(self, name: Name):
        """The node `name` refers to, or None."""
        first, *rest = name.path.split(".")
        found = self.lookup(name.module, first)
        if found is None:
            return None
        node, module = found
        for attr in rest:
            if not isinstance(node, ast.ClassDef):
                return None
            node = self.member(module, node, attr)
            if node is None:
                return None
        return node


def _statements(body):
    """Top-level statements, looking into if/try blocks."""
    for node in body:
        if isinstance(node, ast.If):
            yield from _statements(node.body)
            yield from _statements(node.orelse)
        elif isinstance(node, ast.Try):
            yield from _statements(node.body)
            for handler in node.handlers:
                yield from _statements(handler.body)
        else:
            yield node


def _target_nodes(node):
    """An assignment's targets, tuple targets unpacked (`a, self.x = ...`)."""
    todo, out = list(node.targets if isinstance(node, ast.Assign) else [node.target]), []
    while todo:
        t = todo.pop()
        if isinstance(t, (ast.Tuple, ast.List)):
            todo += t.elts
        else:
            out.append(t)
    return out


def _targets(node) -> set[str]:
    return {t.id for t in _target_nodes(node) if isinstance(t, ast.Name)}


def _absolute(module: str, node: ast.ImportFrom) -> str:
    if not node.level:
        return node.module
    parts = module.split(".")[:-node.level]
    return ".".join(parts + ([node.module] if node.module else []))


def _params(node) -> set[str] | None:
    """Parameter names a def (or a class's __init__ / dataclass fields) accepts; None: any (**kwargs)."""
    if isinstance(node, ast.ClassDef):
        init = next((n for n in node.body if isinstance(n, ast.FunctionDef) and n.name == "__init__"), None)
        if init is None:  # a dataclass: its annotated fields
            return {n.target.id for n in node.body if isinstance(n, ast.AnnAssign) and isinstance(n.target, ast.Name)}
        node = init
    a = node.args
    if a.kwarg is not None:
        return None
    return {p.arg for p in a.posonlyargs + a.args + a.kwonlyargs}


def wheel_for(version: str) -> Path:
    found = sorted(WHEELS.glob(f"sglang-{version}-*.whl")) if WHEELS.is_dir() else []
    if not found:
        pytest.skip(f"no sglang {version} wheel in {WHEELS} (bash .ci/sglang_cpu.sh downloads them there; or set KGEN_SGLANG_WHEELS)")
    return found[0]


@pytest.mark.parametrize("version", SUPPORTED)
def test_every_name_the_adapter_uses_exists_in_that_releases_source(version):
    source = Source(wheel_for(version))
    problems = []
    for name in compat.NAMES:
        if version not in name.versions:
            continue
        node = source.find(name)
        if node is None:
            problems.append(f"{name.module}.{name.path} is missing")
            continue
        accepted = _params(node) if name.params else None
        if accepted is not None:
            problems += [f"{name.module}.{name.path} takes no parameter {p!r}" for p in name.params
                         if p not in accepted]
    assert not problems, f"sglang {version}: " + "; ".join(problems)


@pytest.mark.parametrize("version", SUPPORTED)
def test_release_specific_names_are_absent_from_the_other_releases(version):
    """The bridge's per-release names (or their parameters) really differ (and the source check
    can tell absence)."""
    source = Source(wheel_for(version))

    def present(n: Name) -> bool:
        node = source.find(n)
        accepted = _params(node) if node is not None and n.params else None
        return node is not None and (accepted is None or set(n.params) <= accepted)

    others = [n for n in compat.NAMES if version not in n.versions and n.path != "KVWriteLoc"]
    assert others and not any(present(n) for n in others), [n.path for n in others if present(n)]


# ---- the checks, without SGLang -------------------------------------------------------------------


@pytest.fixture
def fake_sglang(monkeypatch):
    """An 'installed sglang' of a chosen version whose names are a chosen list."""
    def install(version: str, names: tuple[Name, ...] = ()):
        monkeypatch.setattr(compat, "installed_version", lambda: version)
        monkeypatch.setattr(compat, "NAMES", names)
        compat.check.cache_clear()
    yield install
    compat.check.cache_clear()


def test_an_unsupported_version_fails_at_registration_with_one_line(fake_sglang):
    fake_sglang("0.5.20")
    with pytest.raises(SGLangError) as e:
        integration.register()
    msg = str(e.value)
    assert "\n" not in msg and "0.5.20" in msg and "0.5.21, 0.5.22, 0.5.23" in msg and "not registered" in msg


def test_the_plugin_entry_point_logs_the_line_instead_of_raising(fake_sglang, caplog):
    fake_sglang("0.6.0")
    with caplog.at_level(logging.ERROR, logger=integration.__name__):
        integration.plugin()
    assert len(caplog.records) == 1 and "0.6.0" in caplog.records[0].getMessage()


def test_a_missing_or_changed_name_is_one_line_naming_it(fake_sglang):
    fake_sglang("0.5.23", (Name("json", "loads", ("s",)), Name("json", "JSONDecoder.decode", ("s",)),
                           Name("json", "no_such_function")))
    with pytest.raises(SGLangError, match=r"^sglang 0\.5\.23: json\.no_such_function is missing; .*0\.5\.23$"):
        compat.check()
    fake_sglang("0.5.23", (Name("json", "JSONDecoder.raw_decode", ("s", "no_such_parameter")),))
    with pytest.raises(SGLangError, match="json.JSONDecoder.raw_decode takes no parameter 'no_such_parameter'"):
        compat.check()
    fake_sglang("0.5.23", (Name("no_such_module_kgen_test", "x"),))
    with pytest.raises(SGLangError, match="importing no_such_module_kgen_test failed"):
        compat.check()


def test_names_a_release_does_not_use_are_not_checked(fake_sglang):
    fake_sglang("0.5.21", (Name("json", "no_such_function", versions=("0.5.22", "0.5.23")),
                           Name("json", "no_such_defrag_name", defrag=True)))
    assert compat.check() == "0.5.21"
    with pytest.raises(SGLangError, match="no_such_defrag_name"):
        compat.check(defrag=True)


def test_an_object_missing_an_attribute_the_backend_reads_is_one_line(fake_sglang):
    fake_sglang("0.5.22", (Name("json", "X.present", instance=True), Name("json", "X.absent", instance=True)))
    obj = type("X", (), {"present": 1})()
    with pytest.raises(SGLangError, match=r"^sglang 0\.5\.22: a X has no attribute 'absent'"):
        compat.check_instance(obj, "X")

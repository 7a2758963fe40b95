"""The benchmarks run by hand, not in CI, so a rename in corehandler or tests/support breaks them unseen (one
did: bench/upload.py kept calling paths.feeder_path after the feeder moved to tests/support/cbuild.py). This
reads each benchmark's source and checks every name it takes from those modules still exists."""

from __future__ import annotations

import ast
import importlib
import sys
from pathlib import Path

import pytest

ROOT = Path(__file__).resolve().parents[2]
BENCH = ROOT / "bench"
OURS = ("corehandler", "support", "common", "sdcd")


def _ours(module: str) -> bool:
    return module.split(".")[0] in OURS


def used_names(path: Path) -> list[tuple[str, str, int]]:
    """(module, name, line) for `from M import name` and for `alias.name` where `from P import alias` or
    `import M as alias` bound alias to one of our modules."""
    tree = ast.parse(path.read_text(), str(path))
    modules: dict[str, str] = {}
    found = []
    for node in ast.walk(tree):
        if isinstance(node, ast.ImportFrom) and node.module and _ours(node.module) and node.level == 0:
            for alias in node.names:
                found.append((node.module, alias.name, node.lineno))
                modules[alias.asname or alias.name] = f"{node.module}.{alias.name}"
        elif isinstance(node, ast.Import):
            for alias in node.names:
                if _ours(alias.name):
                    modules[alias.asname or alias.name] = alias.name
    for node in ast.walk(tree):
        if isinstance(node, ast.Attribute) and isinstance(node.value, ast.Name) and node.value.id in modules:
            found.append((modules[node.value.id], node.attr, node.lineno))
    return found


def _resolve(module: str):
    try:
        return importlib.import_module(module)
    except ModuleNotFoundError:
        parent, _, name = module.rpartition(".")
        return getattr(importlib.import_module(parent), name)


@pytest.mark.parametrize("script", sorted(BENCH.glob("*.py")), ids=lambda p: p.name)
def test_every_name_a_benchmark_uses_exists(script, monkeypatch):
    monkeypatch.syspath_prepend(str(ROOT / "tests"))
    monkeypatch.syspath_prepend(str(BENCH))
    missing = []
    for module, name, line in used_names(script):
        target = _resolve(module)
        if isinstance(target, type(sys)) and not hasattr(target, name):
            try:
                importlib.import_module(f"{module}.{name}")  # a submodule
            except ModuleNotFoundError:
                missing.append(f"{script.name}:{line}: {module}.{name}")
    assert not missing, "names the benchmark uses that are gone: " + ", ".join(missing)


def test_the_check_sees_a_missing_name(tmp_path):
    bad = tmp_path / "bad.py"
    bad.write_text("from corehandler import paths\npaths.feeder_path()\n")
    assert ("corehandler.paths", "feeder_path", 2) in used_names(bad)
    assert not hasattr(importlib.import_module("corehandler.paths"), "feeder_path")

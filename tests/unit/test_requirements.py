"""pyproject.toml declares what the code imports, at versions that have what it uses: CI installs from it on a
fresh machine, where nothing installed by hand is there."""

from __future__ import annotations

import ast
import re
import sys
import tomllib
from pathlib import Path

REPO = Path(__file__).resolve().parents[2]
# import name -> distribution name, where they differ
DISTRIBUTIONS = {"prometheus_client": "prometheus-client", "yaml": "pyyaml", "systemd": "systemd-python",
                 "helm_python": "helm-python-sdk", "kubernetes_validate": "kubernetes-validate"}
# Names first available in a version of a dependency: (import name, attribute) -> minimum version.
INTRODUCED = {("prometheus_client", "disable_created_metrics"): (0, 18)}
# (elffile: corehandler/elffile.py, imported by that name where analysis/jail.py runs as a script)
LOCAL = {"corehandler", "support", "fakehost", "kernel_matrix", "kernel_profile", "common", "conftest", "elffile"}


def project() -> dict:
    return tomllib.loads((REPO / "pyproject.toml").read_text())["project"]


def requirements(specs: list[str]) -> dict[str, tuple[int, ...] | None]:
    out = {}
    for spec in specs:
        m = re.match(r"^([A-Za-z0-9_.-]+)\s*(?:>=\s*([0-9.]+))?", spec)
        out[m.group(1).lower()] = tuple(int(p) for p in m.group(2).split(".")) if m.group(2) else None
    return out


def imports(tree: Path) -> tuple[set[str], set[tuple[str, str]]]:
    """Top-level third-party modules imported below tree, and the (module, name) pairs of `from m import n`."""
    modules, names = set(), set()
    for path in tree.rglob("*.py"):
        for node in ast.walk(ast.parse(path.read_text())):
            if isinstance(node, ast.Import):
                modules.update(alias.name.split(".")[0] for alias in node.names)
            elif isinstance(node, ast.ImportFrom) and node.module and node.level == 0:
                top = node.module.split(".")[0]
                modules.add(top)
                names.update((top, alias.name) for alias in node.names)
    ours = LOCAL | {p.stem for p in (REPO / "tests").rglob("*.py")} | {p.stem for p in (REPO / "bench").glob("*.py")}
    return {m for m in modules if m not in sys.stdlib_module_names and m not in ours}, names


def fleet_extra() -> dict[str, tuple[int, ...] | None]:
    return requirements(project()["optional-dependencies"]["fleet"])


def test_runtime_imports_are_dependencies():
    """Of the base dependencies, or of the `fleet` extra (corehandler-fleet's libraries)."""
    declared = requirements(project()["dependencies"]) | fleet_extra()
    modules, _ = imports(REPO / "corehandler")
    assert {DISTRIBUTIONS.get(m, m) for m in modules} - set(declared) == set()


def test_only_the_fleet_imports_the_fleet_extra_at_load():
    """The host package runs without corehandler-fleet: outside corehandler/fleet/, the fleet's libraries are
    imported inside the functions that use them (fleet verbs, uploads), never when a module loads."""
    extra, found = set(fleet_extra()), []
    for path in (REPO / "corehandler").rglob("*.py"):
        if (REPO / "corehandler" / "fleet") in path.parents:
            continue
        for node in ast.parse(path.read_text()).body:
            names = ([a.name for a in node.names] if isinstance(node, ast.Import) else
                     [node.module] if isinstance(node, ast.ImportFrom) and node.module and node.level == 0 else [])
            found += [f"{path.relative_to(REPO)}: {n}" for n in names if n.split(".")[0] in extra]
    assert found == []


def test_test_imports_are_in_the_test_extra():
    declared = (requirements(project()["dependencies"]) | requirements(project()["optional-dependencies"]["test"])
                | fleet_extra())
    modules, _ = imports(REPO / "tests")
    assert {DISTRIBUTIONS.get(m, m) for m in modules} - set(declared) == set()


def test_minimum_versions_have_what_the_code_uses():
    declared = requirements(project()["dependencies"])
    _, names = imports(REPO / "corehandler")
    for (module, name), version in INTRODUCED.items():
        if (module, name) in names:
            minimum = declared[DISTRIBUTIONS.get(module, module)]
            assert minimum is not None and minimum >= version, \
                f"{module}.{name} needs {DISTRIBUTIONS.get(module, module)}>={'.'.join(map(str, version))}"

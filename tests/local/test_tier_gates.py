"""The tier gates of tests/conftest.py, run as a person runs them: the header says a tier runs only when every
need of it is met, and in CI a skip fails the run."""

from __future__ import annotations

import os
import shutil
import subprocess
import sys
from pathlib import Path

TESTS = Path(__file__).resolve().parents[1]


def pytest_run(tmp_path: Path, *args: str, tools: tuple[str, ...], **env: str) -> subprocess.CompletedProcess:
    """pytest in a child, with a PATH that holds only `tools` (and the interpreter's directory)."""
    bin_dir = tmp_path / "bin"
    bin_dir.mkdir(exist_ok=True)
    for tool in tools:
        found = shutil.which(tool)
        assert found, f"{tool} is not installed here (scripts/apt/test.txt lists it)"
        if not (bin_dir / tool).exists():
            os.symlink(found, bin_dir / tool)
    environ = {k: v for k, v in os.environ.items() if k not in ("CI", "COREHANDLER_KERNEL_DIR")}
    environ.update(PATH=f"{bin_dir}:{Path(sys.executable).parent}", **env)
    return subprocess.run([sys.executable, "-m", "pytest", "-p", "no:cacheprovider", *args], cwd=TESTS.parent,
                          env=environ, capture_output=True, text=True, timeout=600)


def header(result: subprocess.CompletedProcess) -> str:
    return next(line for line in result.stdout.splitlines() if line.startswith("corehandler tiers:"))


def test_qemu_runs_only_with_its_kernel_images(tmp_path):
    (tmp_path / "kernels").mkdir()
    result = pytest_run(tmp_path, "--collect-only", str(TESTS / "kernel"), tools=("qemu-system-x86_64",),
                        COREHANDLER_KERNEL_DIR=str(tmp_path / "kernels"))
    assert "qemu: skipped (qemu tests need kernel images: no kernel image" in header(result), header(result)


def test_prometheus_runs_only_with_promtool_too(tmp_path):
    result = pytest_run(tmp_path, "--collect-only", str(TESTS / "local" / "test_dashboards.py"),
                        tools=("prometheus",))
    assert "prometheus: skipped (prometheus tests need promtool" in header(result), header(result)


def test_containers_run_only_with_podman_runc_and_mmdebstrap(tmp_path):
    result = pytest_run(tmp_path, "--collect-only", str(TESTS / "containers"), tools=("podman", "runc"))
    assert "containers: skipped (containers tests need mmdebstrap" in header(result) or \
        "containers: skipped (containers tests need root" in header(result), header(result)


def test_a_skip_fails_the_run_in_ci(tmp_path):
    args = [str(TESTS / "local" / "test_dashboards.py"), "-k", "promtool"]
    local = pytest_run(tmp_path, *args, tools=("prometheus",))
    assert local.returncode == 0 and "2 skipped" in local.stdout, local.stdout
    for how, extra, env in (("CI=true", [], {"CI": "true"}), ("--ci", ["--ci"], {})):
        ci = pytest_run(tmp_path, *args, *extra, tools=("prometheus",), **env)
        # The gate's skip happens in setup, so pytest counts each as an error: the run fails either way.
        assert ci.returncode == 1 and "2 errors" in ci.stdout, (how, ci.stdout)
        assert "skipped in CI, where every tier must run: prometheus tests need promtool" in ci.stdout, how

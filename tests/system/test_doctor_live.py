"""`corehandler doctor` on the live kernel: its findings agree with what the kernel does when asked directly,
and --probe (a real crash through a temporary core_pattern) puts core_pattern back on every exit path."""

from __future__ import annotations

import json
import platform
import subprocess
import sys
from pathlib import Path

import pytest

from corehandler import csplice_contract
from corehandler.errors import SystemFailure
from corehandler.host import kernelprobe, sysctl

pytestmark = [pytest.mark.root, pytest.mark.live_kernel]

PATTERN = Path("/proc/sys/kernel/core_pattern")


def doctor(*args: str) -> dict:
    script = Path(sys.executable).parent / "corehandler"
    out = subprocess.run([str(script), "--json", "doctor", *args], capture_output=True, text=True, timeout=300)
    assert out.returncode == 0, out.stderr
    return {f["name"]: f for f in json.loads(out.stdout)}


def test_socket_mode_is_reported_exactly_when_the_kernel_takes_a_socket_pattern(host_core_settings):
    modes = kernelprobe.core_modes()["value"] or []
    # The kernel itself decides: it refuses a core_pattern of a kind it does not parse.
    try:
        host_core_settings.point("@@/run/corehandler-doctor-test.socket")
        accepted = PATTERN.read_text().startswith("@@")
    except SystemFailure:
        accepted = False
    assert ("socket" in modes) == accepted
    if platform.release().startswith("6.18"):
        assert "socket" in modes


def current() -> tuple[str, str]:
    return PATTERN.read_text(), Path("/proc/sys/kernel/core_pipe_limit").read_text()


def test_probe_finds_pidfd_and_the_kernels_copy_kind_and_restores_the_pattern(host_core_settings):
    # The fixture has borrowed the handler: the probe's own borrow, in this process, holds the same lock again
    # and puts back what it found, the fixture's pattern.
    host_core_settings.point("core.doctor-test", 3)
    before = current()
    found = {f["name"]: f for f in kernelprobe.probe_crash()}
    assert current() == before
    use_pipe = found["coredump_use_pipe"]
    assert use_pipe["how"] == "probed"
    # The probe's behaviour and the kernel's symbol table (strategy.py) agree on which kernel this is.
    assert use_pipe["value"] is csplice_contract.kernel_vmsplices_cores(), use_pipe
    assert use_pipe["core_bytes"] > 1 << 20  # the 1 MiB filler was dumped too
    # %F (6.16) predates socket mode (6.17): a kernel with the one passes a pidfd of the crashed process as %F.
    if "socket" in (kernelprobe.core_modes()["value"] or []):
        assert found["pidfd_specifier"]["value"] is True, found["pidfd_specifier"]
    else:
        assert isinstance(found["pidfd_specifier"]["value"], bool)


def test_a_failed_probe_restores_the_pattern(host_core_settings, monkeypatch):
    host_core_settings.point("core.doctor-test", 3)
    before = current()
    monkeypatch.setattr(kernelprobe, "CHILD", "pass")  # a probe process that does not crash
    with pytest.raises(SystemFailure, match="did not die of SIGSEGV"):
        kernelprobe.probe_crash(timeout=5)
    assert current() == before
    assert sysctl.read(sysctl.CORE_PATTERN) == "core.doctor-test"


def test_doctor_probe_from_the_command_line_answers_in_json():
    found = doctor("--probe")
    assert found["coredump_use_pipe"]["how"] == found["pidfd_specifier"]["how"] == "probed"
    assert found["coredump_use_pipe"]["value"] is csplice_contract.kernel_vmsplices_cores()

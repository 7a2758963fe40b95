"""A real crash of a process with a huge untouched mapping, through the live kernel's core_pattern: the kernel
writes such a mapping into the pipe as zeros (up to 128 TiB of them), and csplice, past max_dump_size or refusing the
dump, must not read them all while the process holds one of the kernel's core_pipe_limit slots: it drains for
a bounded time, then closes the pipe, which ends the kernel's dump. v0.2 drained to the end (or the 1 h
timeout): sixteen such crashes made the kernel skip every other dump on the host."""

from __future__ import annotations

import json
import os
import resource
import shutil
import signal
import subprocess
import tempfile
from pathlib import Path

import pytest

from corehandler.config import CaptureConfig
from support.crash import build_crasher
from support.daemon_harness import wait_for
from support.host_core import capture_into

pytestmark = [pytest.mark.root, pytest.mark.live_kernel]

# 16 GiB: the kernel walks every page of it before the zeros (~0.8 us a page here), then writes them at
# ~0.6 GB/s: v0.2 drained for a minute, csplice now for CAPTURE_DRAIN_NS.
MAPPED_MIB = 16 << 10
MiB = 1 << 20


@pytest.fixture
def spool(host_core_settings):
    base = Path(tempfile.mkdtemp(prefix="cht-drain-"))
    try:
        (base / "state" / "spool").mkdir(mode=0o700, parents=True)
        capture_into(host_core_settings, base / "state", CaptureConfig.model_validate({
            "min_free": "0", "max_per_exe_per_minute": 0, "max_dump_size": "8M", "strategy": "rw"}))
        yield base / "state" / "spool", build_crasher(base / "bin")
    finally:
        shutil.rmtree(base)


def crash_untouched(crasher: Path, spool: Path, core_limit: int) -> dict:
    """Crashes a process with MAPPED_MIB mapped and untouched; returns csplice's record of it."""
    def limits():
        resource.setrlimit(resource.RLIMIT_CORE, (core_limit, resource.RLIM_INFINITY))

    got = subprocess.run([str(crasher), "segv", str(MAPPED_MIB), "--untouched"], preexec_fn=limits,
                         capture_output=True, timeout=90)
    assert got.returncode == -signal.SIGSEGV, got
    [name] = wait_for(lambda: [n for n in os.listdir(spool) if n.endswith(".json")], what="the record")
    return json.loads((spool / name).read_text())


def test_past_max_dump_size_the_rest_is_not_drained_to_the_end(spool):
    spool_dir, crasher = spool
    rec = crash_untouched(crasher, spool_dir, resource.RLIM_INFINITY)
    cap = rec["capture"]
    assert (cap["truncated"], cap["truncated_reason"], cap["bytes"]) == (True, "max_dump_size", 8 * MiB)
    assert cap["drained_bytes"] < (MAPPED_MIB - 8) * MiB
    assert any("Stopped draining" in e for e in rec["errors"]), rec["errors"]


def test_a_refused_dump_is_not_drained_to_the_end_either(spool):
    """RLIMIT_CORE 0 (most distributions' default): the kernel still pipes the whole dump to a handler."""
    spool_dir, crasher = spool
    cap = crash_untouched(crasher, spool_dir, 0)["capture"]
    assert (cap["dropped_reason"], cap["bytes"]) == ("rlimit_core", 0)
    assert cap["drained_bytes"] < MAPPED_MIB * MiB

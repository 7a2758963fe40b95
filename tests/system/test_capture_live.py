"""Every capture strategy on the live kernel: a real process crashes through core_pattern into csplice, and
its core is checked word by word (the kernel matrix's verifier, guest.c `verify`: ET_CORE, the crashing
thread's NT_PRSTATUS, the pattern region and its untouched half as zeros).

The kernel matrix's guests (tests/kernel) run a tinyconfig 6.1 with the spool on tmpfs, which has no
O_DIRECT: there `direct` falls back to rw. Here the spool is on the host's own filesystem, so `direct` runs its
O_DIRECT ring for real, with zero pages left as holes."""

from __future__ import annotations

import json
import subprocess
import sys
from pathlib import Path

import pytest

from corehandler import paths
from corehandler.config import CaptureConfig
from corehandler.csplice_contract import PIDFD_SPECIFIER, SPECIFIERS, STRATEGIES

sys.path.insert(0, str(Path(__file__).resolve().parents[1] / "kernel"))
import kernel_matrix  # noqa: E402

from support.crash import _allow_core, build_crasher  # noqa: E402
from support.host_core import capture_into  # noqa: E402
from support.waiting import wait_for  # noqa: E402

pytestmark = [pytest.mark.root, pytest.mark.live_kernel]

MiB = 1 << 20


@pytest.fixture(scope="module")
def tools(tmp_path_factory):
    cache = tmp_path_factory.mktemp("tools")
    return build_crasher(cache), kernel_matrix.build_guest(cache)


def fstype(path: Path) -> str:
    return subprocess.run(["stat", "-f", "-c", "%T", str(path)], capture_output=True, text=True).stdout.strip()


@pytest.mark.parametrize("half", (False, True), ids=("dense", "half-untouched"))
@pytest.mark.parametrize("strategy", STRATEGIES)
def test_a_real_crash_is_captured_word_for_word(host_core_settings, tools, tmp_path, strategy, half):
    crasher, guest = tools
    spool = tmp_path / "spool"
    if fstype(tmp_path) in ("tmpfs", "ramfs"):
        pytest.fail(f"{tmp_path} is on {fstype(tmp_path)}: direct would fall back to rw")
    # An explicit strategy is used for every dump, whole (direct_above=0).
    capture = CaptureConfig.model_validate({"strategy": strategy, "min_free": "0", "max_pending": 0,
                                            "max_per_exe_per_minute": 0, "sparse": True})
    capture_into(host_core_settings, spool.parent, capture,
                 pattern=f"|{paths.csplice_path()} {SPECIFIERS} {PIDFD_SPECIFIER}")
    mib = 40  # twenty of direct's 2 MiB slots: both writers busy and every slot refilled
    argv = [str(crasher), "segv", str(mib)] + (["--untouched-half"] if half else [])
    proc = subprocess.Popen(argv, stdout=subprocess.PIPE, text=True, preexec_fn=_allow_core)
    out, _ = proc.communicate(timeout=120)
    assert proc.returncode == -11, out
    _, addr, length = next(li for li in out.splitlines() if li.startswith("region ")).split()
    # csplice commits the record after it lets the process go. Whatever else crashes on this machine meanwhile
    # lands in the spool too.
    def mine():
        return next((r for r in map(json.loads, (p.read_text() for p in spool.glob("[!.]*.json")))
                     if r["pid"] == proc.pid), None)

    record = wait_for(mine, 30, "csplice's record")
    cap = record["capture"]
    assert cap["complete"] and cap["strategy"] == strategy, cap
    core = spool / record["core"]
    assert core.stat().st_size == cap["bytes"] > mib * MiB
    if half and strategy in ("rw", "rw2", "direct"):
        # The untouched half arrived as zeros and was skipped: holes, not written blocks.
        assert core.stat().st_blocks * 512 < cap["bytes"] - mib * MiB // 4, core.stat()
    checked = subprocess.run([str(guest), "verify", str(core), str(proc.pid), addr, length, str(int(half)), "segv"],
                             capture_output=True, text=True, timeout=60)
    assert json.loads(checked.stdout)["ok"], checked.stdout

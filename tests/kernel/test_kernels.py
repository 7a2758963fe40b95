"""csplice under real kernels: Linux 6.1 stock and with the COREDUMP_USE_PIPE vmsplice patch (README.md), each
booted under qemu (TCG) with an initramfs whose PID 1 crashes processes through csplice and checks every core.

Images: COREHANDLER_KERNEL_DIR (relative to the repository root, e.g. ../shared/kernel) or the cache of
tests/kernel/build-kernels.sh. One boot per kernel, about 10-30 s each under TCG.
"""

from __future__ import annotations

import os
import re

import kernel_matrix as km
import pytest
from kernel_matrix import Case

pytestmark = pytest.mark.qemu

MIB = 1 << 20
# Every strategy once, dense and half-untouched, one thread and five. The guest's spool is its initramfs, which
# has no O_DIRECT: `direct` there is its fallback to rw, byte-correct (tests/local/test_csplice_direct.py runs
# direct itself on the live kernel's disk, tests/system/test_capture_live.py on real crashes).
FALLBACK = {"direct": "rw"}
CASES = [
    Case("segv-dense-16-rw", kind="segv", mib=16, strategy="rw"),
    Case("segv-half-32-splice", kind="segv", mib=32, untouched_half=True, strategy="splice"),
    Case("abort-dense-16-rw2", kind="abort", mib=16, strategy="rw2"),
    Case("abort-half-64-splice2", kind="abort", mib=64, untouched_half=True, strategy="splice2",
         chunk_size=MIB, pipe_size=MIB),
    Case("segv-dense-24-direct", kind="segv", mib=24, strategy="direct", pipe_size=MIB),
]


@pytest.fixture(scope="module")
def images() -> dict:
    # Module scope: read before the function-scoped fixture that clears COREHANDLER_* from the environment.
    try:
        return km.kernel_images(km.kernel_dir())
    except km.MatrixError as e:
        # Images named on purpose must be there; without the variable, a machine that never built them skips.
        if os.environ.get("COREHANDLER_KERNEL_DIR"):
            pytest.fail(str(e))
        pytest.skip(str(e))


@pytest.fixture(scope="module")
def initrd(tmp_path_factory):
    try:
        return km.build_initramfs(CASES, tmp_path_factory.mktemp("initramfs") / "initramfs.cpio")
    except km.MatrixError as e:
        pytest.fail(str(e))


@pytest.fixture(scope="module")
def boots(images, initrd):
    """Boots each kernel once, on first use."""
    cache: dict[str, km.Boot] = {}

    def get(flavour: str) -> km.Boot:
        if flavour not in cache:
            cache[flavour] = km.boot(images[flavour], initrd, smp=2, timeout=240)
        return cache[flavour]

    return get


@pytest.mark.parametrize("flavour", km.FLAVOURS)
def test_guest_runs_to_the_end(boots, flavour):
    boot = boots(flavour)
    assert not boot.timed_out and boot.finished, f"guest did not finish:\n{boot.console[-4000:]}"
    assert boot.case("boot")["cpus"] == 2


@pytest.mark.parametrize("flavour", km.FLAVOURS)
def test_kernel_is_the_one_it_claims(boots, images, flavour):
    """A mix-up of the two images must fail here, not produce a wrong benchmark."""
    boot = boots(flavour)
    probe = boot.case("probe")
    # Zero copy is the patch: only the patched kernel leaves a reference to the dumped page in the pipe.
    assert probe["ok"] and probe["dumped"], probe
    assert probe["pages"] == ("reference" if flavour == "patched" else "copy"), probe
    kallsyms = boot.case("kallsyms")
    if kallsyms["available"]:
        assert (kallsyms["vmsplice_to_pipe"] == "T") == (flavour == "patched"), kallsyms
    system_map = images[flavour].with_name(f"System.map-{flavour}")
    if system_map.exists():
        is_global = re.search(r"^[0-9a-f]+ T vmsplice_to_pipe$", system_map.read_text(), re.M) is not None
        assert is_global == (flavour == "patched"), system_map


@pytest.mark.parametrize("flavour", km.FLAVOURS)
@pytest.mark.parametrize("case", CASES, ids=lambda c: c.name)
def test_csplice_captures_byte_correct_dumps(boots, flavour, case):
    result = boots(flavour).case(case.name)
    assert result["ok"], result
    # ok means: the crasher died of its signal with a core, csplice committed a complete record whose byte
    # count is the core's size, the core is ET_CORE with the right NT_PRSTATUS notes and the region's pattern.
    assert result["verified"] and result["signal"] == (6 if case.kind == "abort" else 11), result
    assert result["threads"] == (5 if case.kind == "abort" else 1), result
    assert result["strategy"] == FALLBACK.get(case.strategy, case.strategy), result
    assert result["core_bytes"] > case.mib * MIB, result

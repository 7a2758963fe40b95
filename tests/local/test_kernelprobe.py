"""corehandler doctor's findings (corehandler/host/kernelprobe.py): what it reads from fake roots, how it tells a
copied page from a referenced one in a core, and its measurements on this host agreeing with their verdicts."""

from __future__ import annotations

import json
import os
import shutil
import struct
import subprocess
import sys
from pathlib import Path

import pytest

from corehandler.errors import UnsafePathError
from corehandler.host import kernelprobe


def test_core_modes_read_from_the_sysctl_root(tmp_path):
    (tmp_path / "kernel").mkdir()
    assert kernelprobe.core_modes(tmp_path)["value"] is None  # a kernel before 6.17: no core_modes
    (tmp_path / "kernel/core_modes").write_text("file pipe socket\n")
    found = kernelprobe.core_modes(tmp_path)
    assert found["value"] == ["file", "pipe", "socket"] and found["how"] == "read"


def test_coredump_filter_is_decoded(tmp_path):
    (tmp_path / "self").mkdir()
    (tmp_path / "self/coredump_filter").write_text("00000033\n")
    found = kernelprobe.coredump_filter(tmp_path)
    assert found["value"] == "0x33"
    assert found["detail"] == "dumps anonymous private, anonymous shared, ELF headers, private huge pages"


def core_with_probe_page(byte: bytes, vaddr: int = kernelprobe.PROBE_ADDR) -> bytes:
    """An ELF64 core with one PT_LOAD at vaddr holding a page of byte."""
    ehdr = bytearray(64)
    ehdr[:4] = b"\x7fELF"
    struct.pack_into("<Q", ehdr, 32, 64)          # e_phoff
    struct.pack_into("<HH", ehdr, 54, 56, 1)      # e_phentsize, e_phnum
    phdr = struct.pack("<IIQQQQQQ", 1, 6, 4096, vaddr, 0, 4096, 4096, 4096)
    return bytes(ehdr) + phdr + bytes(4096 - 64 - 56) + byte * 4096


@pytest.mark.parametrize("byte,verdict", ((b"A", "copy"), (b"B", "reference"), (b"x", "garbage")))
def test_probe_page_verdict(byte, verdict):
    assert kernelprobe._probe_page_verdict(core_with_probe_page(byte)) == verdict


def test_probe_page_verdict_without_the_segment():
    assert kernelprobe._probe_page_verdict(core_with_probe_page(b"A", vaddr=0x400000)) == "no-segment"
    assert kernelprobe._probe_page_verdict(b"not a core at all, but long enough" * 3) == "not-elf"


def test_doctor_on_this_host_agrees_with_what_it_measured():
    script = Path(sys.executable).parent / "corehandler"
    out = subprocess.run([str(script), "--json", "doctor"], capture_output=True, text=True, timeout=120, check=True)
    found = {f["name"]: f for f in json.loads(out.stdout)}
    modes = Path("/proc/sys/kernel/core_modes")
    if modes.exists():
        assert found["core_modes"]["value"] == modes.read_text().split()
    assert found["core_pipe_limit"]["value"] == int(Path("/proc/sys/kernel/core_pipe_limit").read_text())
    splice = found["zero_page_splice"]
    ratio = splice["splice_bytes_per_second"] / splice["read_bytes_per_second"]
    assert splice["value"] == (ratio >= kernelprobe.ZERO_PAGE_SPLICE_RATIO) and splice["how"] == "measured"
    align = found["zero_mapping_pmd_aligned"]
    assert align["value"] == (align["aligned"] == align["mappings"] == 8)
    # Nothing crashed without --probe.
    assert found["coredump_use_pipe"]["how"] == found["pidfd_specifier"]["how"] == "not probed"


def test_the_probe_runs_no_interpreter_or_package_someone_else_could_change(tmp_path):
    """doctor --probe puts this interpreter into core_pattern, so the kernel runs it as root: it must be
    root's alone, as csplice must be (issue 20, item 11)."""
    if os.geteuid() != 0:
        pytest.skip("root owns what root may run; as another user every path is refused")
    shared = tmp_path / "shared"
    shared.mkdir()
    python = shared / "python3"
    shutil.copy(os.path.realpath(sys.executable), python)
    package = shared / "corehandler"
    package.mkdir()
    os.chmod(tmp_path, 0o755)
    kernelprobe.check_probe_handler(str(python), package)  # root's, 0755: fine
    os.chmod(shared, 0o777)  # anyone could swap the interpreter the kernel runs as root
    with pytest.raises(UnsafePathError, match="writable by group or others"):
        kernelprobe.check_probe_handler(str(python), package)
    os.chmod(shared, 0o755)
    os.chown(package, 4321, 4321)  # a user's package directory: they would write the handler's code
    with pytest.raises(UnsafePathError, match="owned by uid 4321"):
        kernelprobe.check_probe_handler(str(python), package)
    kernelprobe.check_probe_handler()  # this test run's own: root's

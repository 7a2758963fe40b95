"""The guest's capture check (guest.c, `guest verify`) on hand-made cores: it must pass a good core and name
what is wrong with a bad one, or a green kernel matrix would prove nothing. Runs on the host, no qemu."""

from __future__ import annotations

import json
import struct
import subprocess

import kernel_matrix
import pytest

PATTERN = 0xC0FFEE00C0FFEE00
ADDR = 0x7F0000000000
LEN = 64 * 1024
PID = 4242


def make_core(threads=((PID, 11),), region: bytes | None = None, e_type: int = 4, vaddr: int = ADDR) -> bytes:
    """A minimal x86-64 ELF core: one PT_NOTE with an NT_PRSTATUS per (pid, signal), one PT_LOAD region."""
    notes = b""
    for pid, signal in threads:
        desc = bytearray(336)
        struct.pack_into("<h", desc, 12, signal)
        struct.pack_into("<i", desc, 32, pid)
        notes += struct.pack("<III", 5, len(desc), 1) + b"CORE\0\0\0\0" + bytes(desc)
    if region is None:
        region = b"".join(struct.pack("<Q", (i * 8) ^ PATTERN) for i in range(LEN // 8))
    note_off = 64 + 2 * 56
    load_off = note_off + len(notes)
    header = b"\x7fELF" + bytes([2, 1, 1]) + bytes(9)
    header += struct.pack("<HHIQQQIHHHHHH", e_type, 62, 1, 0, 64, 0, 0, 64, 56, 2, 0, 0, 0)
    phdrs = struct.pack("<IIQQQQQQ", 4, 4, note_off, 0, 0, len(notes), 0, 4)
    phdrs += struct.pack("<IIQQQQQQ", 1, 6, load_off, vaddr, 0, len(region), len(region), 4096)
    return header + phdrs + notes + region


def verify(guest, tmp_path, core: bytes, half: bool = False, kind: str = "segv") -> dict:
    path = tmp_path / "core"
    path.write_bytes(core)
    done = subprocess.run([str(guest), "verify", str(path), str(PID), hex(ADDR), str(LEN), str(int(half)), kind],
                          capture_output=True, text=True, timeout=60)
    result = json.loads(done.stdout)
    assert (done.returncode == 0) == result["ok"]
    return result


@pytest.fixture(scope="module")
def guest(tmp_path_factory):
    return kernel_matrix.build_guest(tmp_path_factory.mktemp("guest"))


def good_region(half: bool = False) -> bytearray:
    words = [(i * 8) ^ PATTERN if not half or i < LEN // 16 else 0 for i in range(LEN // 8)]
    return bytearray(b"".join(struct.pack("<Q", w) for w in words))


def test_a_good_core_passes(guest, tmp_path):
    assert verify(guest, tmp_path, make_core()) == {"ok": True, "error": "", "threads": 1}


def test_untouched_half_is_zeros(guest, tmp_path):
    assert verify(guest, tmp_path, make_core(region=bytes(good_region(half=True))), half=True)["ok"]
    assert "wrong word" in verify(guest, tmp_path, make_core(), half=True)["error"]


def test_a_multithreaded_abort_core_passes(guest, tmp_path):
    threads = [(PID + 3, 6), (PID, 0), (PID + 1, 0), (PID + 2, 0), (PID + 4, 0)]
    assert verify(guest, tmp_path, make_core(threads=threads), kind="abort")["threads"] == 5


def test_a_region_inside_a_merged_segment_is_found(guest, tmp_path):
    core = make_core(region=bytes(4096) + bytes(good_region()), vaddr=ADDR - 4096)
    assert verify(guest, tmp_path, core)["ok"]


BAD_CORES = {
    "last-word-wrong": (lambda: make_core(region=bytes(good_region()[:-8]) + b"\1" * 8),
                        "wrong word at region offset 65528"),
    "truncated": (lambda: make_core()[:-100], "runs past the end"),
    "other-pid": (lambda: make_core(threads=((PID + 1, 11),)), "no NT_PRSTATUS for pid 4242"),
    "wrong-signal": (lambda: make_core(threads=((PID, 6),)), "died of signal 6"),
    "extra-thread": (lambda: make_core(threads=((PID, 11), (PID + 1, 0))), "2 NT_PRSTATUS notes"),
    "not-a-core": (lambda: make_core(e_type=2), "is not ET_CORE"),
    "region-missing": (lambda: make_core(vaddr=ADDR + 4096), "no segment at the region's address"),
    "header-only": (lambda: b"\x7fELF" + bytes(10), "core of 14 bytes"),
    "not-elf": (lambda: b"not an elf file at all" + bytes(100), "not a 64-bit ELF file"),
}


@pytest.mark.parametrize("bad, message", BAD_CORES.values(), ids=BAD_CORES.keys())
def test_a_bad_core_is_named(guest, tmp_path, bad, message):
    result = verify(guest, tmp_path, bad())
    assert not result["ok"] and message in result["error"]

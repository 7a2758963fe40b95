"""ELF core validation on the feeder's cores, hand-made broken ones, and a huge sparse one."""

from __future__ import annotations

import os
import struct
from pathlib import Path

import pytest

from corehandler import elfcore
from support.spoolfeed import emit_core


def test_feeder_core_is_ok(tmp_path, feeder):
    core = emit_core(feeder, tmp_path / "c", 1 << 20)
    info = elfcore.inspect_core(core)
    assert info.status == "ok", info.problems
    assert info.problems == []
    assert (info.elf_class, info.signal, info.fname, info.threads) == (64, 11, "feeder", 1)
    assert info.pid > 0
    assert info.expected_size == info.size == 1 << 20


@pytest.mark.parametrize("keep", [3, 40, 200, 5000, (1 << 20) - 1])
def test_truncated_core(tmp_path, feeder, keep):
    core = emit_core(feeder, tmp_path / "c", 1 << 20)
    os.truncate(core, keep)
    info = elfcore.inspect_core(core)
    assert info.status == "truncated"
    assert any(p.startswith("truncated") for p in info.problems), info.problems
    if keep > 4096:
        assert f"{(1 << 20) - keep} missing" in info.problems[0]


@pytest.mark.parametrize("data,problem", [
    (b"", "empty file"),
    (b"#!/bin/sh\necho not a core\n", "not an ELF file"),
    (b"\x7fELF\x09" + bytes(60), "unknown ELF class 9"),
])
def test_not_a_core(tmp_path, data, problem):
    path = tmp_path / "c"
    path.write_bytes(data)
    info = elfcore.inspect_core(path)
    assert info.status == "invalid"
    assert info.problems == [problem]


def test_executable_is_not_a_core():
    info = elfcore.inspect_core(Path("/bin/true"))
    assert info.status == "invalid"
    assert info.problems[0].startswith("not a core file (ELF type")


def test_missing_file(tmp_path):
    info = elfcore.inspect_core(tmp_path / "nothing")
    assert info.status == "invalid" and info.problems[0].startswith("cannot open")


def _note(ntype: int, desc: bytes, end: str = "<") -> bytes:
    pad = (-len(desc)) % 4
    return struct.pack(end + "III", 5, len(desc), ntype) + b"CORE\0\0\0\0" + desc + bytes(pad)


def _core32(load_size: int, notes: bytes) -> bytes:
    """An ELFCLASS32 core: header, PT_NOTE and PT_LOAD program headers, the notes, the load segment."""
    ehsize, phsize = 52, 32
    note_off = ehsize + 2 * phsize
    load_off = note_off + len(notes)
    eh = struct.pack("<16sHHIIIIIHHHHHH", b"\x7fELF\x01\x01\x01" + bytes(9), elfcore.ET_CORE, 3, 1, 0, ehsize,
                     0, 0, ehsize, phsize, 2, 0, 0, 0)
    ph_note = struct.pack("<IIIIIIII", elfcore.PT_NOTE, note_off, 0, 0, len(notes), 0, 0, 4)
    ph_load = struct.pack("<IIIIIIII", elfcore.PT_LOAD, load_off, 0x8000000, 0, load_size, load_size, 6, 4096)
    return eh + ph_note + ph_load + notes + bytes(load_size)


def test_elfclass32_core_with_nt_file(tmp_path):
    prstatus = bytearray(144)
    struct.pack_into("<h", prstatus, 12, 6)       # pr_cursig: SIGABRT
    struct.pack_into("<i", prstatus, 24, 31337)   # pr_pid
    prpsinfo = bytearray(124)
    prpsinfo[28:28 + 8] = b"old\xffapp\0"         # fname with a byte that is not UTF-8
    prpsinfo[44:44 + 10] = b"old-app -x"
    names = [b"/usr/bin/old-app", b"/lib/libc.so.6"]
    nt_file = struct.pack("<II", 2, 4096) + struct.pack("<6I", 0x1000, 0x2000, 0, 0x3000, 0x4000, 1) + \
        b"\0".join(names) + b"\0"
    notes = _note(1, bytes(prstatus)) + _note(3, bytes(prpsinfo)) + _note(elfcore.NT_FILE, nt_file)
    path = tmp_path / "c32"
    path.write_bytes(_core32(8192, notes))
    info = elfcore.inspect_core(path)
    assert info.status == "ok", info.problems
    assert (info.elf_class, info.pid, info.signal, info.psargs) == (32, 31337, 6, "old-app -x")
    assert info.fname.encode("utf-8", "surrogateescape") == b"old\xffapp"
    assert info.files == ["/usr/bin/old-app", "/lib/libc.so.6"]


def test_core_without_notes_is_invalid(tmp_path):
    path = tmp_path / "c"
    data = bytearray(_core32(4096, b""))
    struct.pack_into("<I", data, 52, elfcore.PT_LOAD)  # turn the PT_NOTE entry into another load
    path.write_bytes(bytes(data))
    info = elfcore.inspect_core(path)
    assert info.status == "invalid"
    assert "no PT_NOTE segment" in info.problems


def test_huge_sparse_core_is_read_by_headers_only(tmp_path, feeder):
    """A core whose load segment says 64 GiB: only headers and notes are read (the test would run out of
    memory or time otherwise), and the file's real size is checked against it."""
    core = emit_core(feeder, tmp_path / "c", 64 << 10)
    data = bytearray(core.read_bytes()[:4096])
    phoff = struct.unpack_from("<Q", data, 32)[0]
    load = phoff + 56
    offset = struct.unpack_from("<Q", data, load + 8)[0]
    struct.pack_into("<QQ", data, load + 32, 64 << 30, 64 << 30)  # p_filesz, p_memsz
    core.write_bytes(bytes(data))
    os.truncate(core, offset + (64 << 30))
    info = elfcore.inspect_core(core)
    assert info.status == "ok", info.problems
    assert info.size == info.expected_size == offset + (64 << 30)
    os.truncate(core, offset + (32 << 30))
    info = elfcore.inspect_core(core)
    assert info.status == "truncated"
    assert info.problems == [f"truncated: {offset + (32 << 30)} of {offset + (64 << 30)} bytes "
                             f"({32 << 30} missing)"]


def _core64_header(phoff: int, phnum: int, shoff: int = 0) -> bytes:
    ident = b"\x7fELF\x02\x01\x01" + bytes(9)
    return struct.pack("<16sHHIQQQIHHHHHH", ident, elfcore.ET_CORE, 62, 1, 0, phoff, shoff, 0, 64, 56, phnum,
                       64, 0, 0)


@pytest.mark.parametrize("data", [
    _core64_header(2**64 - 64, 1) + bytes(200),                        # program headers past 2^63
    _core64_header(64, elfcore.PN_XNUM, shoff=2**64 - 8) + bytes(200),  # segment count past 2^63
    _core64_header(64, 1) + struct.pack("<IIQQQQQQ", elfcore.PT_NOTE, 0, 2**64 - 16, 0, 0, 100, 100, 4),
], ids=["phoff", "shoff", "note-offset"])
def test_offsets_past_what_a_file_can_hold_are_a_truncated_core_not_an_exception(tmp_path, data):
    path = tmp_path / "core"
    path.write_bytes(data)
    info = elfcore.inspect_core(path)
    assert info.status == elfcore.STATUS_TRUNCATED and info.problems

"""Mini cores (corehandler/analysis/minicore.py) of real crashes of tests/support/analysed.c, cored by gdb's
gcore: eu-stack and gdb unwind every thread of the mini core to the same frames as of the full core; its size
stays within the caps; and a raw core that lies (truncated, bogus offsets, counts and pointers) never makes
it raise anything but MiniCoreError."""

from __future__ import annotations

import errno
import random
import shutil
import struct
import sys
from pathlib import Path

import pytest

from corehandler import elfcore
from corehandler.analysis import minicore
from support import realcore
from support.unwound import eu_stack, gdb_bt


@pytest.fixture(scope="module", autouse=True)
def _tools():
    for tool in ("gdb", "eu-stack", "gcc"):
        if not shutil.which(tool):
            pytest.fail(f"{tool} is missing: scripts/install-deps installs it (scripts/apt/*.txt)")


@pytest.fixture(scope="module")
def binary(tmp_path_factory):
    return realcore.build(tmp_path_factory.mktemp("analysed-bin"), name="analysed")


@pytest.fixture(scope="module")
def cores(tmp_path_factory, binary):
    """kind -> (full core, mini core, MiniCore) for each crash, made once for the module."""
    tmp = tmp_path_factory.mktemp("cores")
    out = {}
    for kind, args in {"segv": ("segv",), "thread": ("thread",), "recurse": ("recurse",),
                       "threads64": ("threads", "64")}.items():
        c = realcore.crash(binary, tmp / f"core.{kind}", *args)
        mini = minicore.write(c.core, tmp / f"mini.{kind}")
        out[kind] = (c.core, tmp / f"mini.{kind}", mini)
    return out


def same_frames(full: list[str], mini: list[str], kind: str) -> None:
    """The mini core's frames are the full core's; a stack deeper than the mini's cap is their prefix."""
    if kind == "recurse":
        assert len(mini) > 1000 and mini == full[:len(mini)]
    else:
        assert mini == full


@pytest.mark.parametrize("kind", ["segv", "thread", "recurse", "threads64"])
def test_eu_stack_unwinds_the_mini_core_like_the_full_one(cores, kind):
    full, mini, made = cores[kind]
    f, m = eu_stack(full), eu_stack(mini)
    assert list(m) == list(f)  # every thread, in the kernel's order, the crashing one first
    for tid in f:
        same_frames(f[tid], m[tid], kind if tid == next(iter(f)) else "")
    assert made.threads == len(f) and not made.cut


@pytest.mark.parametrize("kind", ["segv", "thread", "recurse"])
def test_gdb_unwinds_the_mini_core_like_the_full_one(cores, binary, kind):
    full, mini, _ = cores[kind]
    f, m = gdb_bt(binary, full), gdb_bt(binary, mini)
    assert [lwp for lwp, _ in m] == [lwp for lwp, _ in f]
    for (_, ff), (_, mf) in zip(f, m):
        same_frames(ff, mf, kind if len(ff) > 1000 else "")
    crashing = {"segv": "crash_segv", "thread": "worker_crash", "recurse": "recurse"}[kind]
    assert any(frames and frames[0].endswith(crashing) for _, frames in m)


def test_a_python_crash(tmp_path):
    code = "import os, signal; os.kill(os.getpid(), signal.SIGSEGV)"
    c = realcore.crash(Path(sys.executable).resolve(), tmp_path / "core", "-c", code)
    minicore.write(c.core, tmp_path / "mini")
    f, m = eu_stack(c.core), eu_stack(tmp_path / "mini")
    assert m == f and any("kill" in frame for frame in next(iter(m.values())))


def test_size_is_the_caps(cores):
    """≤ the per-thread stack cap (and a page of alignment) per thread, plus notes, module headers and the
    crashing thread's pages; a total cap cuts the other threads' stacks first and says so."""
    full, mini, made = cores["threads64"]
    info = elfcore.inspect_core(mini)
    assert info.status == "ok" and info.threads == 65 == made.threads, info.problems
    notes = sum(p for p in _note_sizes(full))
    assert made.bytes <= notes + 65 * ((64 << 10) + 2 * 4096) + (2 << 20)
    assert made.bytes < full.stat().st_size
    capped = minicore.write(full, mini.with_name("capped"), minicore.Limits(max_bytes=notes + (400 << 10)))
    assert capped.bytes <= notes + (400 << 10) + 4096 * 4
    assert capped.cut and all("past the total cap" in c for c in capped.cut)
    # the crashing thread still unwinds from what was kept
    assert next(iter(eu_stack(mini.with_name("capped")).values())) == next(iter(eu_stack(full).values()))


def test_a_filesystem_refusing_copy_file_range_gives_the_same_mini_core(cores, tmp_path, monkeypatch):
    """The pages go by copy_file_range where the kernel takes it; where it refuses (another filesystem, an old
    kernel), by pread and pwrite, to the same bytes."""
    full, mini, _ = cores["threads64"]
    asked = []

    def refused(*args):
        asked.append(args)
        raise OSError(errno.EXDEV, "Invalid cross-device link")
    monkeypatch.setattr(minicore.os, "copy_file_range", refused)
    minicore.write(full, tmp_path / "by-read")
    assert len(asked) == 1  # refused once, not asked again for the other pages
    assert (tmp_path / "by-read").read_bytes() == mini.read_bytes()


def _note_sizes(core: Path) -> list[int]:
    with open(core, "rb") as f:
        return [len(n) for n in minicore._Raw(f.fileno()).notes]


# -- hostile raw cores -----------------------------------------------------------------------------------------

def _write_or_refuse(src: Path, dest: Path, limits=minicore.Limits(max_bytes=1 << 20)) -> None:
    try:
        made = minicore.write(src, dest, limits)
    except minicore.MiniCoreError:
        assert not dest.exists()
        return
    info = elfcore.inspect_core(dest)
    assert info.status in (elfcore.STATUS_OK, elfcore.STATUS_INVALID) and info.size == made.bytes, info.problems
    assert made.bytes <= (1 << 20) + sum(_note_sizes(src)) + 4096


def test_truncated_anywhere(cores, tmp_path):
    full, _, _ = cores["thread"]
    data = full.read_bytes()
    cuts = sorted({0, 3, 16, 63, 64, 100, 1000, 5000} | set(random.Random(7).sample(range(len(data)), 40)))
    for n in cuts:
        src = tmp_path / "cut"
        src.write_bytes(data[:n])
        _write_or_refuse(src, tmp_path / f"mini.{n}")


def test_corrupt_headers_notes_and_pointers(cores, tmp_path):
    """Random bytes written over the headers and notes (counts, offsets, register values, auxv, NT_FILE)."""
    full, _, _ = cores["thread"]
    data = full.read_bytes()
    notes_end = max(_note_sizes(full)) + 64 * 1024
    rng = random.Random(23)
    for i in range(150):
        mutated = bytearray(data)
        for _ in range(rng.choice((1, 4, 32))):
            at = rng.randrange(min(len(data), notes_end))
            width = rng.choice((1, 2, 4, 8))
            mutated[at:at + width] = rng.choice((b"\xff" * width, bytes(width), rng.randbytes(width)))
        src = tmp_path / "bad"
        src.write_bytes(bytes(mutated))
        _write_or_refuse(src, tmp_path / f"mini.{i}")


def _core64(phdrs: list[tuple], notes: bytes, phnum: int | None = None, shoff: int = 0) -> bytes:
    eh = struct.pack("<16sHHIQQQIHHHHHH", b"\x7fELF\x02\x01\x01" + bytes(9), elfcore.ET_CORE, 62, 1, 0, 64,
                     shoff, 0, 64, 56, len(phdrs) if phnum is None else phnum, 64, 0, 0)
    table = b"".join(struct.pack("<IIQQQQQQ", *p) for p in phdrs)
    return eh + table + notes


def _note(ntype: int, desc: bytes) -> bytes:
    return struct.pack("<III", 5, len(desc), ntype) + b"CORE\0\0\0\0" + desc + bytes(-len(desc) % 4)


@pytest.mark.parametrize("case", ["phoff", "xnum", "note_offset", "load_offset", "huge_namesz", "nt_file_count",
                                  "link_map_loop", "sp_at_top"])
def test_lying_fields(tmp_path, case):
    """Each field a crashed process (or a broken capture) could make lie, alone."""
    regs = [0] * 27
    regs[19] = 0x10000 + 0x100  # rsp inside the load
    prstatus = bytearray(112) + struct.pack("<27Q", *regs) + bytes(8)
    auxv = struct.pack("<6Q", minicore.AT_PHDR, 0x10000, minicore.AT_PHNUM, 4, minicore.AT_PHENT, 56)
    notes = _note(elfcore.NT_PRSTATUS, bytes(prstatus)) + _note(minicore.NT_AUXV, auxv)
    base = 64 + 2 * 56
    load = (elfcore.PT_LOAD, 6, 0x1000, 0x10000, 0, 0x2000, 0x2000, 4096)
    body = bytearray(0x3000)
    # Program headers at 0x10000 naming a dynamic section whose DT_DEBUG points at an r_debug whose link_map
    # points at itself.
    body[0x1000:0x1000 + 2 * 56] = struct.pack("<IIQQQQQQ", minicore.PT_PHDR, 4, 0, 0x10000, 0, 112, 112, 8) + \
        struct.pack("<IIQQQQQQ", minicore.PT_DYNAMIC, 6, 0, 0x10200, 0, 32, 32, 8)
    body[0x1200:0x1220] = struct.pack("<4Q", minicore.DT_DEBUG, 0x10400, 0, 0)
    body[0x1400:0x1410] = struct.pack("<QQ", 1, 0x10800)
    body[0x1800:0x1828] = struct.pack("<5Q", 0, 0x10900, 0, 0x10800, 0x10800)
    note_ph = (elfcore.PT_NOTE, 0, base, 0, 0, len(notes), 0, 4)
    phdrs = [note_ph, load]
    if case == "phoff":
        data = _core64(phdrs, notes)
        data = data[:32] + struct.pack("<Q", 2**64 - 8) + data[40:]
    elif case == "xnum":
        data = _core64(phdrs, notes, phnum=elfcore.PN_XNUM, shoff=2**63)
    elif case == "note_offset":
        data = _core64([(elfcore.PT_NOTE, 0, 2**64 - 16, 0, 0, 1 << 40, 0, 4), load], notes)
    elif case == "load_offset":
        data = _core64([note_ph, (elfcore.PT_LOAD, 6, 2**63, 0x10000, 0, 1 << 60, 1 << 60, 4096)], notes)
    elif case == "huge_namesz":
        bad = struct.pack("<III", 0xFFFFFFF0, 4, 1) + b"CORE"
        data = _core64([(elfcore.PT_NOTE, 0, base, 0, 0, len(bad + notes), 0, 4), load], bad + notes)
    elif case == "nt_file_count":
        nt = struct.pack("<QQ", 2**62, 4096) + struct.pack("<3Q", 0x10000, 0x12000, 0)
        notes += _note(elfcore.NT_FILE, nt)
        data = _core64([(elfcore.PT_NOTE, 0, base, 0, 0, len(notes), 0, 4), load], notes)
    elif case == "sp_at_top":
        regs[19] = 2**64 - 8
        notes = _note(elfcore.NT_PRSTATUS, bytes(112) + struct.pack("<27Q", *regs) + bytes(8))
        data = _core64([(elfcore.PT_NOTE, 0, base, 0, 0, len(notes), 0, 4), load], notes)
    else:  # link_map_loop: the default layout
        data = _core64(phdrs, notes)
    data = bytearray(data.ljust(0x1000, b"\0")) + body[0x1000:]
    src = tmp_path / "core"
    src.write_bytes(bytes(data))
    _write_or_refuse(src, tmp_path / "mini")
    if case == "link_map_loop":
        made = minicore.write(src, tmp_path / "mini")
        assert made.threads == 1 and made.segments == 2  # the notes, and the one page-run of memory


def test_not_a_core(tmp_path, binary):
    with pytest.raises(minicore.MiniCoreError, match="not a core"):
        minicore.write(binary, tmp_path / "mini")
    (tmp_path / "empty").write_bytes(b"")
    with pytest.raises(minicore.MiniCoreError, match="not an ELF"):
        minicore.write(tmp_path / "empty", tmp_path / "mini")
    assert not (tmp_path / "mini").exists()

"""How fast this host's spool filesystem takes a dump, buffered and with O_DIRECT, and what csplice does with it.

csplice writes a dump either through the page cache (every page of the dump needs a fresh page of memory: on
a VM that returns freed memory to its host, free page reporting, each one costs a round trip to the host) or
with O_DIRECT from a few reused buffers (strategy `direct`: the disk's rate). Which one holds a crashed process
shorter is the host's, and on a VM the moment's: on the VMs of bench/results/capture.md O_DIRECT held 1 GiB
3-5x shorter on fresh pages and the page cache won on recycled ones, on bare metal with a slow disk the page
cache wins up to the dirty limit. No constant can be right on all of them, and neither can a probe taken before
the crash, so `corehandler install` and the daemon (at start, when the last measurement is missing, older than
MAX_AGE or from another machine) measure the spool's O_DIRECT rate off the crash path and render it into
csplice.conf as `direct_rate`: csplice writes each dump through the page cache and moves to O_DIRECT as soon
as its own dump runs slower than that (csplice/capture.c), and writes O_DIRECT from the start past the dirty
limit (`direct_above`; choose(), csplice_contract.settings_values). `doctor` shows both.

The measurement: ROUNDS rounds of PROBE_BYTES written into new, already unlinked files in the spool, buffered
(256 KiB write() calls and no fsync: csplice's hold ends when its last write() returns) then O_DIRECT (2 MiB
aligned blocks, two writes in flight, as csplice's direct). The buffered files stay open until the end, so
each round gets fresh pages rather than the ones the round before freed. Bounded: ROUNDS * 2 * PROBE_BYTES
written, well under a second at this machine's rates, and not at all on a filesystem with less than
SPARE_BYTES free.
"""

from __future__ import annotations

import errno
import json
import logging
import mmap
import os
import statistics
import threading
import time
from collections.abc import Callable
from concurrent.futures import ThreadPoolExecutor
from dataclasses import asdict, dataclass
from pathlib import Path

from corehandler.atomicfile import write_atomic
from corehandler.paths import Paths

log = logging.getLogger("corehandler.writerates")

MiB = 1 << 20
PROBE_BYTES = 64 * MiB
ROUNDS = 3
BUFFERED_CHUNK = 256 << 10  # csplice's chunk_size
DIRECT_BLOCK = 2 * MiB  # csplice's direct slots, and as many writes in flight as its writer threads
DIRECT_IN_FLIGHT = 2
SPARE_BYTES = 4 << 30
MAX_AGE = 30 * 86400.0
# Without a measurement: csplice's built-in default (csplice/settings.c), the threshold of v0.2's benchmark.
UNMEASURED_DIRECT_ABOVE = 2 << 30
# Below this a dump is over before two writer threads and their buffers pay off: a tiny crash's hold is the
# kernel's start of the handler, and the page cache takes a few MiB at memory speed.
DIRECT_MIN = 16 * MiB


@dataclass(frozen=True)
class Measurement:
    buffered_bps: float  # bytes per second, write() into fresh page cache, median of the rounds
    direct_bps: float | None  # O_DIRECT; None where the filesystem refuses it
    dirty_limit_bytes: int  # where buffered writes start waiting for writeback (vm.dirty_bytes or _ratio)
    host: dict  # what makes the figures this machine's (host_signature)
    measured_at: float
    rounds: int
    probe_bytes: int
    note: str = ""  # why direct_bps is None


@dataclass(frozen=True)
class Choice:
    direct_above: int  # bytes of VmRSS from which csplice uses direct; 0 never
    direct_rate: int  # bytes/s: rw moves to direct within a dump that runs slower (csplice/capture.c); 0 never
    reason: str


PROC = Path("/proc")


def host_signature(paths: Paths, proc_root: Path = PROC) -> dict:
    """What a measurement belongs to: a new kernel, more or less memory or another spool filesystem measure
    again."""
    return {"kernel": os.uname().release, "mem_total": _meminfo(proc_root).get("MemTotal", 0),
            "spool_dev": os.stat(paths.spool_dir).st_dev}


def _meminfo(proc_root: Path) -> dict[str, int]:
    info = {}
    try:
        text = (proc_root / "meminfo").read_text()
    except OSError:
        return info
    for line in text.splitlines():
        key, _, value = line.partition(":")
        fields = value.split()
        if fields and fields[0].isdigit():
            info[key] = int(fields[0]) * 1024
    return info


def _sysctl_int(proc_root: Path, name: str) -> int:
    try:
        return int((proc_root / "sys" / "vm" / name).read_text().split()[0])
    except (OSError, ValueError, IndexError):
        return 0


def dirty_limit(proc_root: Path) -> int:
    """Bytes of dirty page cache past which writers wait for writeback: vm.dirty_bytes, or vm.dirty_ratio of
    the memory the kernel counts as dirtyable (about MemAvailable)."""
    explicit = _sysctl_int(proc_root, "dirty_bytes")
    if explicit:
        return explicit
    ratio = _sysctl_int(proc_root, "dirty_ratio") or 20
    return _meminfo(proc_root).get("MemAvailable", 0) * ratio // 100


def _probe_file(directory: Path, direct: bool) -> int:
    """A new file in directory, already unlinked: nothing is left behind, whatever stops us."""
    flags = os.O_WRONLY | os.O_CREAT | os.O_EXCL | os.O_CLOEXEC | (os.O_DIRECT if direct else 0)
    for n in range(100):
        path = directory / f".rate-probe-{os.getpid()}-{n}"
        try:
            fd = os.open(path, flags, 0o600)
        except FileExistsError:
            continue
        os.unlink(path)
        return fd
    raise FileExistsError(f"no free probe file name in {directory}")


def _buffered_seconds(directory: Path, size: int, chunk: bytes) -> tuple[float, int]:
    fd = _probe_file(directory, direct=False)
    start = time.perf_counter()
    for off in range(0, size, len(chunk)):
        os.pwrite(fd, chunk, off)
    return time.perf_counter() - start, fd


def _direct_seconds(directory: Path, size: int, block: mmap.mmap) -> float:
    fd = _probe_file(directory, direct=True)
    try:
        offsets = range(0, size, len(block))
        start = time.perf_counter()
        # os.pwrite releases the GIL: DIRECT_IN_FLIGHT writes are in the disk's queue at once.
        with ThreadPoolExecutor(DIRECT_IN_FLIGHT) as pool:
            for done in pool.map(lambda off: os.pwrite(fd, block, off), offsets):
                if done != len(block):
                    raise OSError(f"short O_DIRECT write: {done} of {len(block)} bytes")
        return time.perf_counter() - start
    finally:
        os.close(fd)


def measure(paths: Paths, probe_bytes: int = PROBE_BYTES, rounds: int = ROUNDS, proc_root: Path = PROC) -> Measurement:
    """Measures the spool filesystem's two write rates (see the module docstring). Raises OSError when the spool
    cannot be written or has too little room to measure."""
    spool = paths.spool_dir
    st = os.statvfs(spool)
    # A filesystem that counts no blocks (ramfs) has no free space to run out of.
    if st.f_blocks and st.f_bavail * st.f_frsize < SPARE_BYTES + 2 * probe_bytes * rounds:
        raise OSError(f"less than {(SPARE_BYTES >> 30) + 1} GiB free in {spool}: not measuring write rates there")
    pattern = bytes(range(1, 256)) * (DIRECT_BLOCK // 255 + 1)
    chunk = pattern[:BUFFERED_CHUNK]
    block = mmap.mmap(-1, DIRECT_BLOCK)  # page-aligned, as O_DIRECT needs
    block.write(pattern[:DIRECT_BLOCK])
    buffered, direct, kept, note = [], [], [], ""
    try:
        for _ in range(rounds):
            seconds, fd = _buffered_seconds(spool, probe_bytes, chunk)
            kept.append(fd)
            buffered.append(probe_bytes / seconds)
            if note:
                continue
            try:
                direct.append(probe_bytes / _direct_seconds(spool, probe_bytes, block))
            except OSError as e:
                if e.errno != errno.EINVAL:
                    raise
                note = f"the filesystem of {spool} refuses O_DIRECT ({e.strerror})"
    finally:
        for fd in kept:
            os.close(fd)
        block.close()
    return Measurement(buffered_bps=statistics.median(buffered), direct_bps=statistics.median(direct) if direct
                       else None, dirty_limit_bytes=dirty_limit(proc_root), host=host_signature(paths, proc_root),
                       measured_at=time.time(), rounds=rounds, probe_bytes=probe_bytes, note=note)


def _mib_s(bps: float) -> str:
    return f"{bps / MiB:.0f} MiB/s"


def choose(m: Measurement | None) -> Choice:
    """csplice's direct_above and direct_rate for a measurement (None: not measured yet)."""
    if m is None:
        return Choice(UNMEASURED_DIRECT_ABOVE, 0, "write rates not measured yet (install and the daemon's start "
                      "measure them): csplice's built-in 2 GiB")
    if m.direct_bps is None:
        return Choice(0, 0, f"never direct: {m.note or 'no O_DIRECT rate'}")
    # The probe's buffered rate is the moment's (fresh or recycled pages), so it does not decide: csplice
    # starts every dump through the page cache and moves to direct when its own dump runs slower
    # (capture.c's ADAPT_WINDOW); past the dirty limit the page cache waits for the disk anyway.
    limit = max(DIRECT_MIN, m.dirty_limit_bytes // MiB * MiB)
    return Choice(limit, round(m.direct_bps),
                  f"O_DIRECT {_mib_s(m.direct_bps)}, page cache {_mib_s(m.buffered_bps)} at the probe: rw, moving "
                  f"to direct within a dump once 4 MiB of it ran below 3/4 of {_mib_s(m.direct_bps)}; direct from "
                  f"the start at {limit // MiB} MiB resident (the dirty limit)")


def load(paths: Paths) -> Measurement | None:
    """The last measurement saved, or None (never measured, or unreadable: measured again)."""
    try:
        data = json.loads(paths.capture_rates.read_text())
        return Measurement(**data)
    except (OSError, ValueError, TypeError):
        return None


def save(paths: Paths, m: Measurement) -> None:
    write_atomic(paths.capture_rates, (json.dumps(asdict(m), indent=1) + "\n").encode(), 0o644)


def is_current(m: Measurement | None, paths: Paths, now: float | None = None, proc_root: Path = PROC) -> bool:
    """Whether m still speaks for this machine: measured here (same kernel, memory, spool filesystem) and less
    than MAX_AGE ago."""
    if m is None:
        return False
    now = time.time() if now is None else now
    try:
        host = host_signature(paths, proc_root)
    except OSError:
        return False
    return m.host == host and 0 <= now - m.measured_at < MAX_AGE


def refresh(paths: Paths, force: bool = False, proc_root: Path = PROC) -> tuple[Measurement | None, str | None]:
    """Measures and saves unless the saved measurement is current (or force). Returns the measurement in effect
    and the problem that kept a new one from being taken, if any."""
    old = load(paths)
    if not force and is_current(old, paths, proc_root=proc_root):
        return old, None
    try:
        new = measure(paths, proc_root=proc_root)
        save(paths, new)
    except OSError as e:
        return old, f"cannot measure the spool's write rates: {e}"
    return new, None


def describe(m: Measurement | None) -> dict:
    """doctor's and status's view: the rates, when and the choice with its reason."""
    choice = choose(m)
    found = {"direct_above": choice.direct_above, "direct_rate": choice.direct_rate, "reason": choice.reason}
    if m is not None:
        found |= {"buffered_bps": round(m.buffered_bps), "direct_bps": m.direct_bps and round(m.direct_bps),
                  "dirty_limit_bytes": m.dirty_limit_bytes, "measured_at": m.measured_at}
    return found


def refresh_in_background(paths: Paths, then: Callable[[], None]) -> threading.Thread:
    """refresh() in a thread of its own (the daemon's start must not wait for the disk); then() runs after a
    new measurement was saved, to render it into csplice.conf."""
    def run() -> None:
        if is_current(load(paths), paths):
            return
        found, problem = refresh(paths, force=True)
        if problem:
            log.warning("%s; csplice keeps %s", problem, choose(found).reason)
            return
        log.info("capture: %s", choose(found).reason)
        then()

    thread = threading.Thread(target=run, name="writerates", daemon=True)
    thread.start()
    return thread

"""Real cores of real crashes without the kernel's core_pattern: gdb runs the program to its fatal signal and
writes the core with `gcore` (the crashing thread's notes first, as the kernel writes them). Also the spool
record csplice would have written beside it, so the daemon ingests it like any other dump."""

from __future__ import annotations

import hashlib
import json
import os
import resource
import shutil
import subprocess
import time
from dataclasses import dataclass
from pathlib import Path

SOURCE_C = Path(__file__).with_name("analysed.c")
SOURCE_CXX = Path(__file__).with_name("analysed.cc")


def have_gdb() -> bool:
    return shutil.which("gdb") is not None


def build(cache: Path, *flags: str, cxx: bool = False, strip: bool = False, name: str | None = None) -> Path:
    """Compiles analysed.c (or .cc) with flags into cache, once per source and flags."""
    source = SOURCE_CXX if cxx else SOURCE_C
    digest = hashlib.sha256(source.read_bytes() + repr((flags, strip)).encode()).hexdigest()[:12]
    binary = cache / (name or f"analysed-{digest}")
    if not binary.exists():
        cache.mkdir(parents=True, exist_ok=True)
        compiler = "g++" if cxx else "gcc"
        subprocess.run([compiler, "-g", "-O1", "-pthread", *flags, "-o", f"{binary}.tmp", str(source)], check=True)
        if strip:
            subprocess.run(["strip", f"{binary}.tmp"], check=True)
        os.replace(f"{binary}.tmp", binary)
    return binary


@dataclass
class Crash:
    core: Path
    binary: Path
    pid: int
    tid: int
    signal: int


_REPORT = ("python import gdb; t = gdb.selected_thread(); "
           "print('CRASH', gdb.selected_inferior().pid, t.ptid[1], int(gdb.parse_and_eval('$_siginfo.si_signo')))")


def crash(binary: Path, core: Path, *args: str, timeout: float = 120, env: dict | None = None) -> Crash:
    """Runs binary under gdb until its fatal signal and gcores it to `core` (env: added to the program's)."""
    out = subprocess.run(["gdb", "-q", "-nx", "-batch", "-ex", "set pagination off", "-ex", "run", "-ex", _REPORT,
                          "-ex", f"gcore {core}", "-ex", "kill", "--args", str(binary), *args],
                         capture_output=True, text=True, timeout=timeout, stdin=subprocess.DEVNULL,
                         env={**os.environ, **env} if env else None)
    line = next((x for x in out.stdout.splitlines() if x.startswith("CRASH ")), None)
    assert line and core.exists(), f"gdb made no core: {out.stdout}\n{out.stderr}"
    _, pid, tid, sig = line.split()
    return Crash(core, binary, int(pid), int(tid), int(sig))


def crash_attached(argv: list[str], core: Path, *, timeout: float = 120) -> Crash:
    """Starts argv as the kernel execs it (a shebang script through its interpreter, which gdb cannot start
    itself), lets it stop itself (SIGSTOP) before it crashes, attaches gdb, runs it on to its fatal signal
    and gcores it. Its RLIMIT_CORE is 1, which the kernel takes as "dump nowhere", so a crash gdb missed
    never reaches core_pattern."""
    proc = subprocess.Popen(argv, stdin=subprocess.DEVNULL, stdout=subprocess.DEVNULL, stderr=subprocess.DEVNULL,
                            preexec_fn=lambda: resource.setrlimit(resource.RLIMIT_CORE, (1, 1)))
    try:
        deadline = time.monotonic() + timeout
        while Path(f"/proc/{proc.pid}/stat").read_text().rsplit(")", 1)[1].split()[0] != "T":
            assert time.monotonic() < deadline and proc.poll() is None, "the program did not stop itself"
            time.sleep(0.01)
        exe = Path(os.readlink(f"/proc/{proc.pid}/exe"))
        out = subprocess.run(["gdb", "-q", "-nx", "-batch", "-ex", "set pagination off", "-p", str(proc.pid),
                              "-ex", "handle SIGSTOP nostop noprint nopass", "-ex", "continue", "-ex", _REPORT,
                              "-ex", f"gcore {core}", "-ex", "kill"],
                             capture_output=True, text=True, timeout=timeout, stdin=subprocess.DEVNULL)
    finally:
        proc.kill()
        proc.wait()
    line = next((x for x in out.stdout.splitlines() if x.startswith("CRASH ")), None)
    assert line and core.exists(), f"gdb made no core: {out.stdout}\n{out.stderr}"
    _, pid, tid, sig = line.split()
    return Crash(core, exe, int(pid), int(tid), int(sig))


def record_for(c: Crash, dump_id: str, *, uid: int = 0, **proc: object) -> dict:
    """The spool record csplice writes for this crash (the fields analysis and ingest read)."""
    size = c.core.stat().st_size
    return {"schema": 1, "id": dump_id, "core": f"{dump_id}.core", "pid": c.pid, "tid": c.tid, "uid": uid, "gid": uid,
            "signal": c.signal, "timestamp": int(time.time()), "hostname": "testhost", "comm": c.binary.name[:15],
            "boot_id": "0" * 32,
            "proc": {"available": True, "exe": str(c.binary), "comm": c.binary.name[:15],
                     "cmdline": [str(c.binary)], "status": f"Name:\t{c.binary.name[:15]}\nNSpid:\t{c.pid}\n",
                     "cgroup": "0::/system.slice/analysed.service\n", **proc},
            "capture": {"strategy": "rw", "bytes": size, "drained_bytes": 0, "ns": 1000, "complete": True,
                        "truncated": False, "truncated_reason": None, "dropped": False, "dropped_reason": None,
                        "error": None, "elf_magic": True},
            "errors": []}


_seq = 0


def spool(c: Crash, spool_dir: Path, *, uid: int = 0, **proc: object) -> str:
    """Puts the crash's core and record into spool_dir as csplice commits them (the record renamed into place
    whole: a running daemon may be watching); returns the id."""
    global _seq
    _seq += 1
    dump_id = f"{time.time_ns() // 1000 + _seq}-{'0' * 16}-{c.pid}"
    spool_dir.mkdir(mode=0o700, parents=True, exist_ok=True)
    shutil.copyfile(c.core, spool_dir / f"{dump_id}.core")
    os.chmod(spool_dir / f"{dump_id}.core", 0o600)
    tmp = spool_dir / f".tmp.{dump_id}.json"
    tmp.write_text(json.dumps(record_for(c, dump_id, uid=uid, **proc)))
    tmp.rename(spool_dir / f"{dump_id}.json")
    return dump_id

"""Run csplice the way the kernel does, without root: the feeder plays the kernel's side of the pipe.

Every run gets its own settings file (CSPLICE_SETTINGS) and spool under a test's directory and logs to stderr
(CSPLICE_LOG_STDERR=1), so nothing touches the host's spool or kernel log.
"""

from __future__ import annotations

import functools
import hashlib
import json
import os
import socket
import subprocess
import time
from dataclasses import dataclass, field
from pathlib import Path

from corehandler import csplice_contract, paths
from corehandler.config import CaptureConfig
from support import cbuild
from support.record_schema import check_record

MiB = 1 << 20
GiB = 1 << 30
HASH_BLOCK = 4 * MiB
HZ = os.sysconf("SC_CLK_TCK")


def core_args(pid: int, comm: bytes | str = "pytest", signal: int = 11, pidfd: int | None = None,
              hostname: str | None = None, uid: int | None = None) -> list:
    """The argv a kernel would pass for a crash of pid (uid/gid of this process unless given, hostname of this
    host)."""
    args = [str(pid), str(pid), str(pid), str(os.getuid() if uid is None else uid), str(os.getgid()), "1", str(signal),
            str(int(time.time())), "18446744073709551615", hostname or socket.gethostname(), comm]
    if pidfd is not None:
        args.append(str(pidfd))
    return [os.fsencode(a) for a in args]


def hash_stream(f) -> str:
    h = hashlib.sha256()
    while block := f.read(HASH_BLOCK):
        h.update(block)
    return h.hexdigest()


def hash_file(path: Path, limit: int | None = None) -> str:
    """sha256 of the file, or of its first `limit` bytes; streamed, never loaded whole."""
    h = hashlib.sha256()
    left = limit
    with open(path, "rb") as f:
        while left is None or left > 0:
            block = f.read(HASH_BLOCK if left is None else min(HASH_BLOCK, left))
            if not block:
                break
            h.update(block)
            if left is not None:
                left -= len(block)
    return h.hexdigest()


@functools.lru_cache(maxsize=64)
def expected_digest(size: int, zero_regions: bool, pid: int, limit: int | None = None) -> str:
    """sha256 of what the feeder pushes for these options (or of its first `limit` bytes), streamed from
    `feeder --emit /dev/stdout` so a GiB never sits in the test's memory or on disk."""
    cmd = [str(cbuild.feeder()), "--size", str(size), "--pid", str(pid), "--emit", "/dev/stdout"]
    if zero_regions:
        cmd.append("--zero-regions")
    with subprocess.Popen(cmd, stdout=subprocess.PIPE) as proc:
        h = hashlib.sha256()
        left = size if limit is None else min(limit, size)
        while left > 0:
            block = proc.stdout.read(min(HASH_BLOCK, left))
            if not block:
                break
            h.update(block)
            left -= len(block)
        proc.stdout.close()
        proc.wait()
    return h.hexdigest()


@functools.cache
def _builtin() -> csplice_contract.Facts:
    return csplice_contract.builtin_facts(paths.csplice_path())


def render_settings(settings: dict) -> str:
    """csplice.conf with these keys (raw values: a test may pass what csplice must refuse), every other key at
    csplice's built-in default: the one renderer, csplice_contract.render_settings."""
    return csplice_contract.render_settings(CaptureConfig(), Path(settings["spool_dir"]), _builtin(),
                                            overrides=settings)


@dataclass
class Result:
    returncode: int
    stderr: str
    spool: Path
    record: dict | None
    feeder: dict | None = None
    seconds: float = 0.0

    @property
    def core(self) -> Path | None:
        if self.record is None or self.record["core"] is None:
            return None
        return self.spool / self.record["core"]

    @property
    def capture(self) -> dict:
        return self.record["capture"]


@dataclass
class Handler:
    """csplice with a private settings file and spool under base."""

    base: Path
    settings: dict = field(default_factory=dict)
    env: dict = field(default_factory=dict)
    wrapper: list = field(default_factory=list)  # a command prefix, e.g. to run in another namespace
    csplice: Path = field(default_factory=paths.csplice_path)
    feeder: Path = field(default_factory=cbuild.feeder)

    def __post_init__(self):
        self.base.mkdir(parents=True, exist_ok=True)
        self.settings_path = self.base / "csplice.conf"
        self.spool = self.base / "spool"
        # Limits that would make unrelated tests flaky are off unless a test sets them.
        self.settings = {"spool_dir": str(self.spool), "min_free": 0, "max_pending": 0,
                         "max_per_exe_per_minute": 0, **self.settings}
        self.write_settings()

    def configure(self, **settings) -> None:
        self.settings.update(settings)
        self.write_settings()

    def write_settings(self) -> None:
        self.settings_path.write_text(render_settings(self.settings))

    def environment(self) -> dict:
        env = {k: v for k, v in os.environ.items() if not k.startswith("CSPLICE_")}
        env.update({"CSPLICE_SETTINGS": str(self.settings_path), "CSPLICE_LOG_STDERR": "1", **self.env})
        return env

    def records(self) -> dict[str, dict]:
        if not self.spool.is_dir():
            return {}
        return {p.name: json.loads(p.read_bytes()) for p in sorted(self.spool.glob("[!.]*.json"))}

    def _result(self, before: set, args: list, returncode: int, stderr: str, feeder: dict | None,
                seconds: float) -> Result:
        # Runs may overlap (the concurrency test): a run's record is the new one for its %P.
        pid = (args[0] if args else b"").decode(errors="surrogateescape") or None
        new = {name: rec for name, rec in self.records().items()
               if name not in before and rec["specifiers"]["P"] == pid}
        assert len(new) <= 1, f"one run committed {len(new)} records: {sorted(new)}"
        record = next(iter(new.values()), None)
        if record is not None:
            check_record(record)
        return Result(returncode, stderr, self.spool, record, feeder, seconds)

    def feed(self, size: int, mode: str = "write", zero_regions: bool = False, pid: int | None = None,
             args: list | None = None, chunk: int | None = None, pipe_size: int | None = None,
             timeout: float = 300) -> Result:
        """The feeder pushes a synthetic core of `size` bytes into csplice's stdin, as the kernel would."""
        pid = os.getpid() if pid is None else pid
        cmd = [*self.wrapper, str(self.feeder), "--size", str(size), "--mode", mode, "--pid", str(pid)]
        if zero_regions:
            cmd.append("--zero-regions")
        if chunk:
            cmd += ["--chunk", str(chunk)]
        if pipe_size:
            cmd += ["--pipe-size", str(pipe_size)]
        args = args if args is not None else core_args(pid)
        cmd += ["--", str(self.csplice), *args]
        before = set(self.records())
        t0 = time.monotonic()
        proc = subprocess.run(cmd, env=self.environment(), capture_output=True, timeout=timeout)
        seconds = time.monotonic() - t0
        stderr = proc.stderr.decode(errors="replace")
        lines = [line for line in stderr.splitlines() if line.startswith("{")]
        assert proc.returncode == 0 and lines, f"feeder failed ({proc.returncode}): {stderr}"
        stats = json.loads(lines[-1])
        return self._result(before, args, stats["exit"], stderr, stats, seconds)

    def run(self, stdin: bytes = b"", args: list | None = None, timeout: float = 60) -> Result:
        """csplice reads `stdin` from a pipe (written by a thread of subprocess.run)."""
        before = set(self.records())
        t0 = time.monotonic()
        args = args if args is not None else core_args(os.getpid())
        proc = subprocess.run([*self.wrapper, str(self.csplice), *args],
                              input=stdin, env=self.environment(), capture_output=True, timeout=timeout)
        seconds = time.monotonic() - t0
        return self._result(before, args, proc.returncode, proc.stderr.decode(errors="replace"), None, seconds)


def spool_files(spool: Path) -> list[str]:
    """Every name in the spool, hidden ones and .rate entries included."""
    return sorted(str(p.relative_to(spool)) for p in spool.rglob("*"))


def rate_file(exe: bytes, uid: int | None = None) -> str:
    """The name of (uid, exe)'s crash counter below .rate/: spool.c's uid (this process's by default), a dash
    and the 64-bit FNV-1a of the path, in hex."""
    h = 0xCBF29CE484222325
    for b in exe:
        h = ((h ^ b) * 0x100000001B3) & 0xFFFFFFFFFFFFFFFF
    return f"{os.getuid() if uid is None else uid}-{h:016x}"


def make_fake_proc(root: Path, pid: int, comm: bytes, cmdline: list[bytes], exe: bytes,
                   started_ago: float = 900.0, pidfd: int | None = None) -> Path:
    """A /proc with one process, as procinfo.c reads it: <pid>/{exe,comm,cmdline,status,cgroup,stat},
    stat (btime), sys/kernel/random/boot_id and, for %F, self/fdinfo/<pidfd>."""
    btime = int(time.time()) - 100_000
    start_ticks = int((time.time() - started_ago - btime) * HZ)
    d = root / str(pid)
    d.mkdir(parents=True)
    os.symlink(exe, os.fsencode(d / "exe"))
    (d / "comm").write_bytes(comm + b"\n")
    (d / "cmdline").write_bytes(b"".join(a + b"\0" for a in cmdline))
    (d / "status").write_bytes(b"Name:\t" + comm + b"\nPid:\t%d\nUid:\t0\t0\t0\t0\n" % pid)
    (d / "cgroup").write_bytes(b"0::/fake.slice/fake.service\n")
    # Field 22 is the start time; comm may hold ") " so the parser counts from the last ')'.
    fields = ["S"] + ["0"] * 18 + [str(start_ticks)] + ["0"] * 30
    (d / "stat").write_bytes(b"%d (%s) " % (pid, comm) + " ".join(fields).encode() + b"\n")
    (root / "stat").write_text(f"cpu  1 2 3 4\nbtime {btime}\nprocesses 5\n")
    (root / "sys/kernel/random").mkdir(parents=True)
    (root / "sys/kernel/random/boot_id").write_text("0123456789abcdef0123456789abcdef\n")
    if pidfd is not None:
        (root / "self/fdinfo").mkdir(parents=True)
        (root / "self/fdinfo" / str(pidfd)).write_text(f"pos:\t0\nflags:\t02000002\nmnt_id:\t15\nPid:\t{pid}\n")
    return root

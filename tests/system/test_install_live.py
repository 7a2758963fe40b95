"""The real kernel: `corehandler install`, real crashes through csplice, `corehandler uninstall`.

Runs the installed CLI (the console script beside this interpreter) against a temporary state directory, so
the host's /var/lib/corehandler spool is never used; core_pattern, core_pipe_limit, the fixed csplice.conf and
/etc/sysctl.d/50-corehandler.conf are the host's handler, borrowed by the host_core_settings fixture
(host/handler.py borrow()) and put back by it whatever the test leaves.
"""

from __future__ import annotations

import json
import os
import resource
import signal
import stat
import struct
import subprocess
import sys
import time
from pathlib import Path

import pytest

from corehandler import paths as paths_mod
from corehandler.csplice_contract import SPECIFIERS, parse_settings
from corehandler.host import sysctl
from corehandler.paths import Host
from support.crash import PATTERN, build_crasher
from support.waiting import wait_for

pytestmark = [pytest.mark.root, pytest.mark.live_kernel]

SYSCTL_D_FILE = Path("/etc/sysctl.d") / sysctl.SYSCTL_D_NAME
ET_CORE, PT_LOAD, PT_NOTE, NT_PRSTATUS = 4, 1, 4, 1
# struct elf_prstatus on x86_64 and arm64: elf_siginfo (12 bytes), pr_cursig (short) at 12, pr_pid at 32.
PRSTATUS_CURSIG, PRSTATUS_PID = 12, 32


def cli(*args: str, **kwargs) -> subprocess.CompletedProcess:
    script = Path(sys.executable).parent / "corehandler"
    command = [str(script)] if script.exists() else [sys.executable, "-m", "corehandler"]
    return subprocess.run(command + list(args), capture_output=True, text=True, timeout=60, **kwargs)


@pytest.fixture
def dirs(tmp_path):
    etc = tmp_path / "etc"
    etc.mkdir()
    # A floor that a busy /tmp cannot trip, so the dumps are complete whatever the disk holds.
    (etc / "corehandler.toml").write_text('[capture]\nmin_free = "64M"\n')
    return ["--config-dir", str(etc), "--state-dir", str(tmp_path / "state")], tmp_path / "state" / "spool"


def die(argv: list[str]) -> tuple[int, int, str]:
    """Runs argv until it dies; returns its pid, the signal that killed it and its stdout."""
    def allow_core():
        resource.setrlimit(resource.RLIMIT_CORE, (resource.RLIM_INFINITY, resource.RLIM_INFINITY))

    proc = subprocess.Popen(argv, stdout=subprocess.PIPE, stderr=subprocess.DEVNULL, text=True,
                            preexec_fn=allow_core)
    out, _ = proc.communicate(timeout=120)
    assert proc.returncode < 0, f"{argv} exited {proc.returncode} instead of dying of a signal"
    return proc.pid, -proc.returncode, out


def wait_for_record(spool: Path, pid: int, timeout: float = 30) -> dict:
    deadline = time.monotonic() + timeout
    while time.monotonic() < deadline:
        # <CLOCK_REALTIME us>-<boot id>-<pid>[.N].json
        found = [p for p in spool.glob(f"*-{pid}*.json") if p.name.split(".")[0].endswith(f"-{pid}")]
        if found:
            assert len(found) == 1, found
            return json.loads(found[0].read_text())
        time.sleep(0.05)
    raise AssertionError(f"no record for pid {pid} in {spool} after {timeout} s: {sorted(os.listdir(spool))}")


def parse_core(path: Path) -> tuple[list[tuple[int, int, int, int]], list[tuple[int, int]]]:
    """The PT_LOAD segments (vaddr, offset, filesz, memsz) and each NT_PRSTATUS's (pid, cursig) of an ELF
    core, checking the header on the way."""
    data = path.read_bytes()
    assert data[:4] == b"\x7fELF", "not ELF"
    assert data[4] == 2 and data[5] == 1, "not ELFCLASS64 little-endian"
    e_type, = struct.unpack_from("<H", data, 16)
    assert e_type == ET_CORE, f"e_type {e_type}, not ET_CORE"
    e_phoff, = struct.unpack_from("<Q", data, 32)
    e_phentsize, e_phnum = struct.unpack_from("<HH", data, 54)
    assert e_phnum not in (0, 0xFFFF)
    loads, prstatus = [], []
    for i in range(e_phnum):
        p_type, _, p_offset, p_vaddr, _, p_filesz, p_memsz, _ = struct.unpack_from("<IIQQQQQQ", data,
                                                                                   e_phoff + i * e_phentsize)
        assert p_offset + p_filesz <= len(data), f"segment {i} runs past the end of the file"
        if p_type == PT_LOAD:
            loads.append((p_vaddr, p_offset, p_filesz, p_memsz))
        elif p_type == PT_NOTE:
            pos, end = p_offset, p_offset + p_filesz
            while pos + 12 <= end:
                namesz, descsz, n_type = struct.unpack_from("<III", data, pos)
                desc = pos + 12 + (namesz + 3) // 4 * 4
                if n_type == NT_PRSTATUS:
                    cursig, = struct.unpack_from("<h", data, desc + PRSTATUS_CURSIG)
                    pid, = struct.unpack_from("<i", data, desc + PRSTATUS_PID)
                    prstatus.append((pid, cursig))
                pos = desc + (descsz + 3) // 4 * 4
    return loads, prstatus


def check_record(record: dict, spool: Path, pid: int, sig: int, exe: str) -> tuple[list, list]:
    assert record["schema"] == 1
    assert (record["pid"], record["uid"], record["gid"], record["signal"]) == (pid, os.getuid(), os.getgid(), sig)
    assert record["proc"]["available"] is True
    assert record["proc"]["exe"] == exe
    assert record["proc"]["verified"] is True, record["proc"]
    capture = record["capture"]
    assert capture["complete"] is True and capture["truncated"] is False and capture["dropped"] is False, capture
    assert capture["elf_magic"] is True
    assert record["errors"] == [], record["errors"]
    core = spool / record["core"]
    assert record["core"] == f"{record['id']}.core"
    st = core.stat()
    assert stat.S_IMODE(st.st_mode) == 0o600 and st.st_uid == 0
    assert capture["bytes"] == st.st_size > 0
    loads, prstatus = parse_core(core)
    assert pid in [p for p, _ in prstatus], f"no NT_PRSTATUS for pid {pid}: {prstatus}"
    # The first NT_PRSTATUS is the thread that took the signal: the kernel's %I.
    assert prstatus[0] == (record["tid"], sig)
    return loads, prstatus


def check_pattern(core: Path, loads: list, crasher_stdout: str) -> None:
    """The crasher's region is in the core with the pattern it wrote (start, middle, end)."""
    _, address, length = crasher_stdout.split()
    address, length = int(address, 16), int(length)
    segment = [s for s in loads if s[0] <= address < s[0] + s[3]]
    assert segment, f"no PT_LOAD covers the crasher's region at {address:#x}"
    vaddr, offset, filesz, _ = segment[0]
    with open(core, "rb") as f:
        for word in (0, length // 16, length // 8 - 1):
            f.seek(offset + address - vaddr + word * 8)
            assert struct.unpack("<Q", f.read(8))[0] == (word * 8) ^ PATTERN


def bytes_or_none(path: Path) -> bytes | None:
    return path.read_bytes() if path.exists() else None


def test_install_capture_real_crashes_uninstall(host_core_settings, dirs, tmp_path):
    options, spool = dirs
    saved = host_core_settings.found
    settings_before = bytes_or_none(Host().csplice_settings)
    sysctl_d_before = bytes_or_none(SYSCTL_D_FILE)

    # The records are checked in the spool, so no daemon may ingest them first (test_daemon_live covers that).
    result = cli(*options, "install", "--force", "--no-daemon")
    print(result.stdout)
    assert result.returncode == 0, result.stderr
    csplice = Path(os.path.realpath(paths_mod.csplice_path()))
    live_pattern = sysctl.read(sysctl.CORE_PATTERN)
    assert live_pattern.startswith(f"|{csplice} {SPECIFIERS}")
    assert len(live_pattern) <= 127
    assert int(sysctl.read(sysctl.CORE_PIPE_LIMIT)) >= 16
    assert sysctl.read_sysctl_d(Path("/etc/sysctl.d")) == {"kernel.core_pattern": live_pattern,
                                                          "kernel.core_pipe_limit": sysctl.read(sysctl.CORE_PIPE_LIMIT)}
    # csplice.conf names this installation as the handler's owner: its state dir and its id.
    settings = parse_settings(Host().csplice_settings.read_text())
    assert settings["spool_dir"] == str(spool)
    assert (settings["owner"], settings["installation"]) == (str(spool.parent),
                                                            (spool.parent / "installation-id").read_text().strip())
    assert (spool.parent / "previous-handler.conf").exists()
    assert stat.S_IMODE(spool.stat().st_mode) == 0o700

    crasher = build_crasher(tmp_path / "bin")
    crashes = [
        ("segv", [str(crasher), "segv", "1"], signal.SIGSEGV, str(crasher), True),
        ("abort", [str(crasher), "abort", "1"], signal.SIGABRT, str(crasher), True),
        ("python", [sys.executable, "-c", "import os, signal; os.kill(os.getpid(), signal.SIGSEGV)"],
         signal.SIGSEGV, os.path.realpath(sys.executable), False),
    ]
    for name, argv, sig, exe, has_pattern in crashes:
        pid, died_of, out = die(argv)
        assert died_of == sig, name
        record = wait_for_record(spool, pid)
        loads, prstatus = check_record(record, spool, pid, sig, exe)
        if name == "segv":
            assert len(prstatus) == 1
        if name == "abort":
            # The main thread and its four workers; a worker called abort().
            assert len(prstatus) == 5 and prstatus[0][0] != pid
        if has_pattern:
            check_pattern(spool / record["core"], loads, out)

    print(cli(*options, "status").stdout)
    result = cli(*options, "--json", "status")
    assert result.returncode == 0, result.stderr
    status = json.loads(result.stdout)
    assert status["installed"] and status["core_pattern_matches"] and status["settings"]["state"] == "current"
    assert status["capture"]["this"] and status["capture"]["owner"] == str(spool.parent), status["capture"]
    assert status["spool"]["pending"] == len(crashes)

    result = cli(*options, "uninstall")
    print(result.stdout)
    assert result.returncode == 0, result.stderr
    # Exactly what install found goes back: the sysctls, csplice.conf and our sysctl.d file.
    assert {name: sysctl.read(name) for name in saved} == saved
    assert bytes_or_none(Host().csplice_settings) == settings_before
    assert bytes_or_none(SYSCTL_D_FILE) == sysctl_d_before
    assert not (spool.parent / "previous-handler.conf").exists()
    assert len(list(spool.glob("*.json"))) == len(crashes)  # uninstall never deletes dumps


def test_install_refuses_another_handler(host_core_settings, dirs):
    options, spool = dirs
    other = "|/bin/false %p"
    host_core_settings.point(other, host_core_settings.found[sysctl.CORE_PIPE_LIMIT])
    result = cli(*options, "install")
    assert result.returncode == 5
    assert result.stderr == ("corehandler: another core handler is installed (/bin/false): `corehandler install "
                             "--force` replaces it and uninstall puts it back\n")
    assert sysctl.read(sysctl.CORE_PATTERN) == other
    assert not spool.exists()


def test_install_refuses_another_live_installation_unless_forced(host_core_settings, tmp_path):
    """A second state dir's install names the installation that captures; --force takes the handler over, and
    the first's uninstall then leaves the host alone."""
    etc = tmp_path / "etc"
    etc.mkdir()
    (etc / "corehandler.toml").write_text('[capture]\nmin_free = "64M"\n')
    first, second = tmp_path / "first", tmp_path / "second"
    a = ["--config-dir", str(etc), "--state-dir", str(first)]
    b = ["--config-dir", str(etc), "--state-dir", str(second)]
    result = cli(*a, "install", "--force", "--no-daemon")
    assert result.returncode == 0, result.stderr
    pattern = sysctl.read(sysctl.CORE_PATTERN)
    refused = cli(*b, "install", "--no-daemon")
    assert refused.returncode == 5 and f"the installation in {first}" in refused.stderr, refused.stderr
    assert parse_settings(Host().csplice_settings.read_text())["owner"] == str(first)
    result = cli(*b, "install", "--force", "--no-daemon")
    assert result.returncode == 0, result.stderr
    assert parse_settings(Host().csplice_settings.read_text())["owner"] == str(second)
    owned = Host().csplice_settings.read_bytes()
    result = cli(*a, "uninstall")
    assert result.returncode == 0, result.stderr
    assert sysctl.read(sysctl.CORE_PATTERN) == pattern and Host().csplice_settings.read_bytes() == owned
    # The second puts back exactly what it took over: the first's handler (the borrow restores the host's).
    result = cli(*b, "uninstall")
    assert result.returncode == 0, result.stderr
    assert sysctl.read(sysctl.CORE_PATTERN) == pattern
    assert parse_settings(Host().csplice_settings.read_text())["owner"] == str(first)


def test_install_runs_the_daemon_end_to_end(host_core_settings, dirs, tmp_path):
    """What the README's first command leaves behind: a crash ends up compressed in the store, listed, and
    byte-identical out of it; uninstall stops the daemon and restores the kernel's settings."""
    options, spool = dirs
    saved = host_core_settings.found
    crasher = build_crasher(tmp_path / "bin")

    result = cli(*options, "install", "--force")
    assert result.returncode == 0, result.stderr
    assert "daemon started (supervised" in result.stdout
    try:
        pid, signo, _ = die([str(crasher), "segv", "2"])
        assert signo == signal.SIGSEGV

        def listed():
            out = cli(*options, "--json", "list", str(pid))
            return json.loads(out.stdout) if out.returncode == 0 else []

        dumps = wait_for(listed, 60, f"the crash of PID {pid} in the store")
        assert [d["pid"] for d in dumps] == [pid]
        # Listed comes before stored (the index row is written at the hold's end), so the raw core leaves the
        # spool only once its compressed copy is in the store.
        wait_for(lambda: not list(spool.glob("*.core")), 60, "the raw core to leave the spool once stored")
        out = tmp_path / "core"
        assert cli(*options, "dump", str(pid), "-o", str(out)).returncode == 0
        with open(out, "rb") as f:
            assert f.read(4) == b"\x7fELF"
        assert json.loads(cli(*options, "--json", "status").stdout)["daemon"]["state"] == "running"
    finally:
        result = cli(*options, "uninstall")
    assert result.returncode == 0, result.stderr
    assert json.loads(cli(*options, "--json", "status").stdout)["daemon"]["state"] != "running"
    assert {name: sysctl.read(name) for name in saved} == saved

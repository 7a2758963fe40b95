"""The real kernel in socket mode: `corehandler install --mode socket`, csplice's listener, real crashes.

core_pattern becomes "@@<socket>": the kernel connects to the listener, csplice answers its request (taking
the dump or refusing it before it is written) and captures the stream. Like test_install_live (whose checks
these reuse), it runs the installed CLI against a temporary state directory with the host's handler borrowed
(host_core_settings), and puts everything back: core_pattern, core_pipe_limit, csplice.conf, sysctl.d (the
borrow), the listener (uninstall).
"""

from __future__ import annotations

import argparse
import contextlib
import json
import os
import resource
import signal
import socket
import struct
import subprocess
import sys
import time
from pathlib import Path

import pytest
from test_install_live import check_pattern, cli, parse_core, wait_for_record

from corehandler.cli.common import base_paths
from corehandler.host import listener, supervise, sysctl
from corehandler.paths import Paths
from support.crash import build_crasher
from support.waiting import wait_for

pytestmark = [pytest.mark.root, pytest.mark.live_kernel,
              pytest.mark.skipif(listener.socket_prefix() != "@@", reason="needs a kernel with @@ (Linux 6.17+)")]

SOCKET = Path("/run/corehandler-test/capture/coredump.socket")
RLIM_INF = resource.RLIM_INFINITY


@pytest.fixture
def socket_mode(host_core_settings, tmp_path):
    """corehandler installed in socket mode on SOCKET (no daemon: the records are checked in the spool, so
    they stay pending and max_pending is off; the storm's limit is the per-executable one)."""
    yield from _installed(tmp_path, "--force", "--no-daemon", "--mode", "socket")


@pytest.fixture
def package_socket_mode(host_core_settings, tmp_path):
    """As the package's postinst installs it (`install --package`, the mode from the config): postinst has no
    listener of its own to start, so install must start it."""
    yield from _installed(tmp_path, "--package", config='mode = "socket"\n')


def _installed(tmp_path: Path, *install_args: str, config: str = ""):
    etc = tmp_path / "etc"
    etc.mkdir()
    (etc / "corehandler.toml").write_text(f'[capture]\nmin_free = "64M"\nmax_per_exe_per_minute = 16\nmax_pending = 0\n'
                                          f'[kernel]\nsocket_path = "{SOCKET}"\n{config}')
    options = ["--config-dir", str(etc), "--state-dir", str(tmp_path / "state")]
    result = cli(*options, "install", *install_args)
    print(result.stdout, result.stderr)
    try:
        assert result.returncode == 0, result.stderr
        yield options, tmp_path / "state" / "spool"
    finally:
        done = cli(*options, "uninstall")
        # In case uninstall itself failed; the test's own supervisor, never the host's.
        supervise.stop(_paths(tmp_path / "state"), service=supervise.LISTENER)
        assert done.returncode == 0, done.stderr
        assert not listener.listening(SOCKET)


def _paths(state_dir: Path) -> Paths:
    """The paths `corehandler --state-dir` uses: its supervisor keeps its pid files under the state dir."""
    return base_paths(argparse.Namespace(config_dir=None, state_dir=state_dir))


def crash(argv: list[str], rlimit: int = RLIM_INF) -> tuple[int, int, bool, str]:
    """Runs argv to its death; returns its pid, the signal, whether the kernel reports a core, and stdout."""
    def limit():
        resource.setrlimit(resource.RLIMIT_CORE, (rlimit, RLIM_INF))

    proc = subprocess.Popen(argv, stdout=subprocess.PIPE, stderr=subprocess.DEVNULL, text=True, preexec_fn=limit)
    out = proc.stdout.read()
    _, status = os.waitpid(proc.pid, 0)
    proc.returncode = -1  # reaped here, for the core flag subprocess does not keep
    proc.stdout.close()
    assert os.WIFSIGNALED(status), f"{argv} did not die of a signal"
    return proc.pid, os.WTERMSIG(status), os.WCOREDUMP(status), out


def check_socket_record(record: dict, spool: Path, pid: int, sig: int, exe: str) -> tuple[list, list]:
    """test_install_live's checks, for a record of socket mode: the TIDs are not known (the pidfd names the
    thread group), everything else is the same."""
    assert (record["pid"], record["uid"], record["gid"], record["signal"]) == (pid, os.getuid(), os.getgid(), sig)
    assert record["proc"]["exe"] == exe and record["proc"]["verified"] is True, record["proc"]
    cap = record["capture"]
    assert cap["mode"] == "socket" and cap["socket"]["handshake"] is True and cap["socket"]["mark"] == 0
    assert cap["socket"]["ack_mask"] == 1 | 8, cap["socket"]  # KERNEL | WAIT
    assert cap["socket"]["coredump_mask"] & 1, "the peer's pidfd does not say it is being dumped"
    assert cap["complete"] and cap["elf_magic"] and record["errors"] == [], record
    core = spool / record["core"]
    assert cap["bytes"] == core.stat().st_size > 0
    loads, prstatus = parse_core(core)
    assert pid in [p for p, _ in prstatus] and prstatus[0][1] == sig, prstatus
    return loads, prstatus


def test_socket_mode_captures_real_crashes(socket_mode, tmp_path):
    options, spool = socket_mode
    assert sysctl.read(sysctl.CORE_PATTERN) == f"@@{SOCKET}"
    assert (SOCKET.stat().st_mode & 0o777, SOCKET.parent.stat().st_mode & 0o777) == (0o600, 0o700)
    crasher = build_crasher(tmp_path / "bin")
    crashes = [
        ("segv", [str(crasher), "segv", "1"], signal.SIGSEGV, str(crasher)),
        ("abort", [str(crasher), "abort", "1"], signal.SIGABRT, str(crasher)),
        ("python", [sys.executable, "-c", "import os, signal; os.kill(os.getpid(), signal.SIGSEGV)"],
         signal.SIGSEGV, os.path.realpath(sys.executable)),
    ]
    for name, argv, sig, exe in crashes:
        pid, died_of, cored, out = crash(argv)
        assert died_of == sig and cored, name
        loads, prstatus = check_socket_record(wait_for_record(spool, pid), spool, pid, sig, exe)
        if name == "abort":
            assert len(prstatus) == 5 and prstatus[0][0] != pid  # a worker thread called abort()
        if name != "python":
            check_pattern(spool / wait_for_record(spool, pid)["core"], loads, out)

    status = json.loads(cli(*options, "--json", "status").stdout)
    assert status["mode"] == "socket" and status["core_pattern_matches"], status
    assert status["listener"]["listening"] and status["listener"]["supervised"], status["listener"]
    assert "listening on" in cli(*options, "status").stdout


def test_the_package_install_starts_the_listener_and_captures(package_socket_mode, tmp_path):
    options, spool = package_socket_mode
    assert sysctl.read(sysctl.CORE_PATTERN) == f"@@{SOCKET}"
    status = json.loads(cli(*options, "--json", "status").stdout)
    assert status["listener"]["listening"] and status["listener"]["supervised"], status["listener"]
    crasher = build_crasher(tmp_path / "bin")
    pid, _, cored, out = crash([str(crasher), "segv", "1"])
    assert cored
    loads, _ = check_socket_record(wait_for_record(spool, pid), spool, pid, signal.SIGSEGV, str(crasher))
    check_pattern(spool / wait_for_record(spool, pid)["core"], loads, out)


def test_rlimit_core_zero_and_small(socket_mode, tmp_path):
    _, spool = socket_mode
    crasher = build_crasher(tmp_path / "bin")
    pid, _, cored, _ = crash([str(crasher), "segv", "1"], rlimit=0)
    record = wait_for_record(spool, pid)
    assert not cored, "the kernel wrote a dump csplice refused"
    assert record["capture"]["dropped_reason"] == "rlimit_core" and record["capture"]["socket"]["rejected"]
    assert record["core"] is None and record["rlimit_core"] == "0"

    pid, _, _, _ = crash([str(crasher), "segv", "1"], rlimit=200 * 1024)
    record = wait_for_record(spool, pid)
    assert record["capture"]["truncated_reason"] == "rlimit_core", record["capture"]
    assert record["capture"]["bytes"] == (spool / record["core"]).stat().st_size == 200 * 1024


def test_a_storm_is_refused_before_it_is_written(socket_mode, tmp_path):
    """200 crashes of one executable: the first 16 a minute keep their core (max_per_exe_per_minute), the next
    are refused with REJECT and recorded with their reason, and past twice the rate each is refused and shed
    (no record, counted in the spool's .shed): the kernel writes no core for any of them."""
    from corehandler import spool as spool_mod
    _, spool = socket_mode
    crasher = build_crasher(tmp_path / "bin")
    started = time.monotonic()
    results = []
    for _ in range(200):
        results.append(crash([str(crasher), "segv", "1"]))
    took = time.monotonic() - started
    assert took < 60, f"the storm took {took:.0f} s, over the one-minute rate window this test counts in"

    def recorded() -> dict[int, dict]:
        out = {}
        for p in spool.glob("*.json"):
            pid = int(p.name.split(".")[0].rsplit("-", 1)[1])
            out[pid] = json.loads(p.read_text())
        return out
    wait_for(lambda: len(recorded()) + sum(spool_mod.shed_counts(spool).values()) >= 200, 60,
             "every crash recorded or shed")
    records = recorded()
    kept = [pid for pid, r in records.items() if r["capture"]["complete"]]
    assert len(kept) == 16, len(kept)
    for pid, _, cored, _ in results:
        if pid in kept:
            assert cored
            continue
        assert not cored
        if pid in records:
            cap = records[pid]["capture"]
            assert cap["socket"]["rejected"] and cap["dropped_reason"] == "max_per_exe_per_minute", cap
            assert cap["bytes"] == cap["drained_bytes"] == 0
    assert len(records) == 32  # the rate, then as many again as metadata; the rest shed
    assert sum(spool_mod.shed_counts(spool).values()) == 200 - 32
    assert len(list(spool.glob("*.core"))) == 16


def _listener_processes(state_dir: Path) -> list[int]:
    parent = supervise.status(_paths(state_dir), supervise.LISTENER).daemon_pid
    assert parent is not None
    children = Path(f"/proc/{parent}/task/{parent}/children").read_text().split()
    return [parent] + [int(c) for c in children]


def test_listener_killed_mid_dump(socket_mode, tmp_path):
    """SIGKILL to the listener and the csplice capturing a dump: the crashed process is released (the kernel's
    write fails), the supervisor brings the listener back, and the next crash is captured."""
    _, spool = socket_mode
    crasher = build_crasher(tmp_path / "bin")
    proc = subprocess.Popen([str(crasher), "segv", "1024"], stdout=subprocess.DEVNULL,
                            preexec_fn=lambda: resource.setrlimit(resource.RLIMIT_CORE, (RLIM_INF, RLIM_INF)))
    wait_for(lambda: list(spool.glob(".tmp.*.core")) or None, 60, "a capture in progress")
    for pid in _listener_processes(spool.parent):
        with contextlib.suppress(ProcessLookupError):
            os.kill(pid, signal.SIGKILL)
    assert proc.wait(timeout=60) == -signal.SIGSEGV
    wait_for(lambda: listener.listening(SOCKET) or None, 30, "the listener back")
    pid, _, cored, _ = crash([str(crasher), "segv", "1"])
    assert cored and wait_for_record(spool, pid)["capture"]["complete"]


def _talk_like_the_kernel() -> bytes:
    """Connects to the socket and sends a well-formed request and an ELF, as the kernel would; returns what
    came back before csplice closed."""
    with socket.socket(socket.AF_UNIX, socket.SOCK_STREAM) as s:
        s.settimeout(30)
        s.connect(str(SOCKET))
        answer = b""
        with contextlib.suppress(BrokenPipeError, ConnectionResetError):
            s.sendall(struct.pack("<IIQ", 16, 16, 15))
            s.sendall(struct.pack("<I", 0) + b"\x7fELF" + bytes(65536))
            s.shutdown(socket.SHUT_WR)
            while chunk := s.recv(4096):
                answer += chunk
        return answer


def test_only_the_kernel_may_feed_it(socket_mode):
    """A root process that is not being dumped gets nothing back and leaves nothing but the refusal count; a
    non-root user cannot even connect (the socket is root's, 0600 in a 0700 directory)."""
    _, spool = socket_mode
    before = sorted(spool.iterdir())
    assert _talk_like_the_kernel() == b""
    wait_for(lambda: (spool / ".refused").exists() or None, 10, "the refusal counted")
    assert (spool / ".refused").read_text() == "1\n"
    assert sorted(p for p in spool.iterdir() if p.name != ".refused") == [p for p in before if p.name != ".refused"]

    code = ("import socket, sys\ns = socket.socket(socket.AF_UNIX)\ntry:\n    s.connect(sys.argv[1])\n"
            "except PermissionError:\n    sys.exit(13)\nsys.exit(0)\n")
    # The system interpreter: the test venv's may sit where nobody cannot read it.
    nobody = subprocess.run(["/usr/bin/python3", "-c", code, str(SOCKET)], user=65534, group=65534, timeout=30)
    assert nobody.returncode == 13, "a non-root user could connect to the coredump socket"
    assert (spool / ".refused").read_text() == "1\n"
    assert not [p for p in spool.iterdir() if p.suffix in (".json", ".core")]

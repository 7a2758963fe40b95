"""The spool protocol and its safety: the lock that tells a live capture from a dead one, the .json commit
point, symlinks planted in the spool, a spool that can't be used."""

from __future__ import annotations

import fcntl
import os
import signal
import subprocess
import time

import pytest

from support.csplice_harness import Handler, MiB, core_args, rate_file, spool_files

OWN_EXE = os.fsencode(os.readlink("/proc/self/exe"))


@pytest.fixture
def handler(tmp_path):
    return Handler(tmp_path / "h")


def lockable(path) -> bool:
    with open(path, "rb") as f:
        try:
            fcntl.flock(f, fcntl.LOCK_EX | fcntl.LOCK_NB)
        except BlockingIOError:
            return False
        return True


def start_stalled(handler: Handler, first: bytes):
    """csplice with `first` bytes of a dump read and the pipe still open, as during a long capture."""
    r, w = os.pipe()
    proc = subprocess.Popen([str(handler.csplice), *core_args(os.getpid())], stdin=r,
                            env=handler.environment(), stderr=subprocess.DEVNULL)
    os.close(r)
    os.write(w, first)
    deadline = time.monotonic() + 10
    while time.monotonic() < deadline:
        tmp = list(handler.spool.glob(".tmp.*.core"))
        if tmp and tmp[0].stat().st_size == len(first):
            return proc, w, tmp[0]
        time.sleep(0.01)
    raise AssertionError(f"no .tmp core appeared: {spool_files(handler.spool)}")


@pytest.mark.parametrize("strategy", ("rw", "splice", "rw2", "splice2", "direct"))
def test_live_capture_is_locked_and_only_the_json_commits(handler, strategy):
    # rw2 and direct hand over whole slots (1 and 8 MiB): feed exactly that much so the partial file shows.
    size = 8 * MiB if strategy == "direct" else MiB
    handler.configure(strategy=strategy, chunk_size=65536)
    proc, w, tmp = start_stalled(handler, b"\x7fELF" + b"x" * (size - 4))
    try:
        assert not lockable(tmp), "a live capture's .tmp core must be locked"
        names = spool_files(handler.spool)
        assert not [n for n in names if n.endswith(".json")], names  # nothing committed yet
    finally:
        os.close(w)
    assert proc.wait(timeout=30) == 0
    (record,) = handler.records().values()
    core = handler.spool / record["core"]
    assert core.stat().st_size == size and lockable(core)
    assert not [n for n in spool_files(handler.spool) if n.startswith(".tmp")]


def test_killed_capture_leaves_a_lockable_orphan(handler):
    proc, w, tmp = start_stalled(handler, b"\x7fELF" + b"x" * 60_000)
    proc.send_signal(signal.SIGKILL)
    proc.wait()
    os.close(w)
    assert lockable(tmp)
    # No record, not even a half-written one: the record file had no name yet.
    assert [n for n in spool_files(handler.spool) if "json" in n] == []


def test_rate_dir_symlink_is_not_followed(handler, tmp_path):
    elsewhere = tmp_path / "elsewhere"
    elsewhere.mkdir()
    handler.spool.mkdir(mode=0o700)
    (handler.spool / ".rate").symlink_to(elsewhere)
    handler.configure(max_per_exe_per_minute=2)
    result = handler.feed(65536)
    assert result.returncode == 0 and result.capture["complete"]
    assert list(elsewhere.iterdir()) == []
    assert any("crash rate" in e for e in result.record["errors"])


def test_rate_file_symlink_is_not_followed(handler, tmp_path):
    victim = tmp_path / "victim"
    victim.write_bytes(b"precious\n")
    (handler.spool / ".rate").mkdir(parents=True, mode=0o700)
    (handler.spool / ".rate" / rate_file(OWN_EXE)).symlink_to(victim)
    handler.configure(max_per_exe_per_minute=2)
    result = handler.feed(65536)
    assert result.returncode == 0 and result.capture["complete"]
    assert victim.read_bytes() == b"precious\n"
    assert any("crash rate" in e for e in result.record["errors"])


def test_spool_dir_symlink_is_refused_and_the_dump_drained(tmp_path):
    target = tmp_path / "target"
    target.mkdir()
    handler = Handler(tmp_path / "h")
    handler.spool.symlink_to(target)
    result = handler.feed(4 * MiB)
    assert result.returncode == 73 and result.record is None
    assert result.feeder["push_error"] == 0  # released: the dump was drained
    assert list(target.iterdir()) == []
    assert "Failed to open spool" in result.stderr and "lost" in result.stderr


def test_spool_dir_is_created_private(handler):
    handler.configure(max_per_exe_per_minute=16)  # so that .rate/ and its counter exist too
    result = handler.feed(4096)
    rate = handler.spool / ".rate"
    modes = {p: p.stat().st_mode & 0o777 for p in (handler.spool, rate, rate / rate_file(OWN_EXE), result.core,
                                                  handler.spool / (result.record["id"] + ".json"))}
    assert modes == {p: 0o700 if p.is_dir() else 0o600 for p in modes}


def test_spool_parent_missing_is_a_clear_error(tmp_path):
    handler = Handler(tmp_path / "h")
    handler.configure(spool_dir=str(tmp_path / "no" / "such" / "spool"))
    result = handler.run(stdin=b"\x7fELF" * 1000)
    assert result.returncode == 73 and result.record is None
    assert "No such file or directory" in result.stderr

"""csplice started the way the kernel starts it (fds 1 and 2 closed, no environment, stdin the core pipe), and
started by hand the ways the kernel never does (stdin a terminal, /dev/null or a file; garbage argv; a PID that
is not alive): the first logs to the kernel log, the second is a usage error that stores nothing."""

from __future__ import annotations

import contextlib
import errno
import json
import os
import pty
import subprocess
import time
from pathlib import Path

import pytest

from corehandler import paths
from support.csplice_harness import Handler, core_args, render_settings, spool_files

EXIT_USAGE = 64  # docs/design.md: csplice's exit codes
NO_SUCH_PID = 2**22 + 7  # above the largest pid_max Linux allows


@pytest.fixture
def handler(tmp_path):
    return Handler(tmp_path / "h")


def run_with_stdin(handler: Handler, stdin, args: list | None = None, env: dict | None = None,
                   timeout: float = 20) -> subprocess.CompletedProcess:
    args = args if args is not None else core_args(os.getpid())
    return subprocess.run([str(handler.csplice), *args], stdin=stdin, capture_output=True, timeout=timeout,
                          env=handler.environment() if env is None else env)


def assert_refused(handler: Handler, result: subprocess.CompletedProcess, *words: str) -> None:
    stderr = result.stderr.decode(errors="replace")
    assert result.returncode == EXIT_USAGE, (result.returncode, stderr)
    assert len(stderr.splitlines()) == 1 and all(w in stderr for w in words), stderr
    assert not handler.spool.exists() or spool_files(handler.spool) == [], spool_files(handler.spool)


@pytest.mark.parametrize("source", ["/dev/null", "regular file"])
def test_stdin_that_is_no_pipe_is_a_usage_error(handler, tmp_path, source):
    path = Path(source) if source.startswith("/") else tmp_path / "core"
    if not source.startswith("/"):
        path.write_bytes(b"\x7fELF" + b"\0" * 4096)
    with open(path, "rb") as f:
        result = run_with_stdin(handler, f)
    assert_refused(handler, result, "stdin must be the kernel's core pipe", "nothing stored")


def test_terminal_on_stdin_is_refused_at_once(handler):
    """A terminal used to block for the whole timeout and leave a .tmp core the daemon adopted as an orphan."""
    handler.configure(timeout=30)
    controller, terminal = pty.openpty()
    try:
        t0 = time.monotonic()
        result = run_with_stdin(handler, terminal, timeout=10)
        assert time.monotonic() - t0 < 10
    finally:
        os.close(controller)
        os.close(terminal)
    assert_refused(handler, result, "a terminal")


@pytest.mark.parametrize("pid", [b"", b"hello", b"-1", b"0", str(2**32 + 4242).encode(), str(NO_SUCH_PID).encode()],
                         ids=["empty", "word", "negative", "zero", "past-int", "not-alive"])
def test_pid_that_is_no_live_process_is_a_usage_error(handler, pid):
    args = core_args(os.getpid())
    args[0] = pid
    result = handler.run(stdin=b"\x7fELF" + b"\0" * 4096, args=args)
    assert result.record is None
    assert result.returncode == EXIT_USAGE, result.stderr
    assert "nothing stored" in result.stderr and "PID" in result.stderr
    assert not handler.spool.exists()


def test_no_arguments_is_a_usage_error_on_stderr(handler):
    with open("/dev/null", "rb") as null:
        result = run_with_stdin(handler, null, args=[], env={})
    assert result.returncode == EXIT_USAGE
    assert result.stderr.decode().startswith("csplice: Usage: csplice %P")


def test_refusal_goes_to_stderr_when_the_log_is_elsewhere(handler):
    """Started by hand without CSPLICE_LOG_STDERR, the person still reads why on stderr, not in the kernel
    log only."""
    env = {"CSPLICE_SETTINGS": str(handler.settings_path)}
    with open("/dev/null", "rb") as null:
        result = run_with_stdin(handler, null, env=env)
    assert_refused(handler, result, "stdin must be the kernel's core pipe")


def test_a_helper_process_pid_is_accepted(handler):
    """The other side of the check: a live process's PID and a pipe make a record (what the tests feed)."""
    with subprocess.Popen(["sleep", "60"]) as helper:
        try:
            result = handler.feed(8192, pid=helper.pid)
        finally:
            helper.kill()
    assert result.returncode == 0 and result.record["pid"] == helper.pid and result.capture["complete"]


# -- started exactly as the kernel starts it ---------------------------------------------------------------


class Kmsg:
    """The kernel log from now on: records written after open() (a reader of /dev/kmsg needs root)."""

    def __init__(self):
        self.fd = os.open("/dev/kmsg", os.O_RDONLY | os.O_NONBLOCK)
        os.lseek(self.fd, 0, os.SEEK_END)

    def lines(self, tag: str) -> list[str]:
        out = []
        while True:
            try:
                record = os.read(self.fd, 8192).decode(errors="replace")
            except OSError as err:
                if err.errno == errno.EAGAIN:
                    return out
                if err.errno == errno.EPIPE:  # overwritten while we read: go on from the next record
                    continue
                raise
            message = record.split(";", 1)[1].split("\n", 1)[0]
            if message.startswith(tag):
                out.append(message)

    def close(self):
        os.close(self.fd)


def as_the_kernel(csplice: Path, args: list, stdin: bytes) -> tuple[int, int]:
    """Runs csplice with stdin a pipe carrying `stdin`, fds 1 and 2 closed and an empty environment, the way
    the kernel's usermode helper does. Returns its pid and exit status."""
    read_end, write_end = os.pipe()

    def close_stdout_stderr():
        os.close(1)
        os.close(2)

    proc = subprocess.Popen([str(csplice), *args], stdin=read_end, env={}, close_fds=True,
                            preexec_fn=close_stdout_stderr)
    os.close(read_end)
    with contextlib.suppress(BrokenPipeError):
        os.write(write_end, stdin)
    os.close(write_end)
    return proc.pid, proc.wait(timeout=30)


def wait_for_lines(kmsg: Kmsg, tag: str) -> list[str]:
    deadline = time.monotonic() + 5  # the record is in the kernel's buffer once write() returned; be lenient
    while not (lines := kmsg.lines(tag)) and time.monotonic() < deadline:
        time.sleep(0.05)
    return lines


@pytest.mark.root
def test_kernel_start_logs_to_the_kernel_log(host_core_settings, tmp_path):
    """The settings come from the fixed path (no environment); the non-ELF warning must reach /dev/kmsg."""
    spool = tmp_path / "spool"
    host_core_settings.write_settings(render_settings({"spool_dir": str(spool), "min_free": 0, "max_pending": 0,
                                                       "max_per_exe_per_minute": 0}))
    kmsg = Kmsg()
    try:
        pid, status = as_the_kernel(paths.csplice_path(), core_args(os.getpid()), b"no core here\n" * 100)
        lines = wait_for_lines(kmsg, f"csplice[{pid}]: ")
    finally:
        kmsg.close()
    assert status == 0
    assert any("is not an ELF file" in line for line in lines), lines
    assert len([n for n in os.listdir(spool) if n.endswith(".json")]) == 1


@pytest.mark.root
def test_kernel_start_with_a_dead_pid_is_refused_in_the_kernel_log(tmp_path):
    spool = tmp_path / "spool"
    args = core_args(NO_SUCH_PID)
    kmsg = Kmsg()
    try:
        pid, status = as_the_kernel(paths.csplice_path(), args, b"\x7fELF" + b"\0" * 4096)
        lines = wait_for_lines(kmsg, f"csplice[{pid}]: ")
    finally:
        kmsg.close()
    assert status == EXIT_USAGE
    assert any(f"PID {NO_SUCH_PID} is not a live process" in line for line in lines), lines
    assert not spool.exists()


def boot_pattern_argv(crashed: int, kernel_splits_first: bool) -> list[bytes]:
    """The argv a kernel without %F (before 6.16) makes of the package's boot-time pattern: it expands an
    unknown specifier to nothing (fs/coredump.c format_corename), which leaves an empty last argument where it
    splits the pattern before expanding it (5.7 on), and none where it splits the expansion (argv_split)."""
    template = (Path(__file__).parents[2] / "packaging" / "sysctl.d" / "50-corehandler.conf.in").read_text()
    pattern = next(line.split("=", 1)[1].strip() for line in template.splitlines()
                   if line.startswith("kernel.core_pattern"))
    program, *specifiers = pattern.split()
    assert program == "|@CSPLICE@" and specifiers[-1] == "%F"
    values = core_args(crashed)
    assert len(values) == len(specifiers) - 1  # every other specifier has its value
    return values + [b""] if kernel_splits_first else values


@pytest.mark.root
@pytest.mark.parametrize("kernel_splits_first", [True, False], ids=["empty-last-argument", "no-last-argument"])
def test_the_boot_patterns_F_on_a_kernel_without_it_is_no_pidfd(host_core_settings, tmp_path, kernel_splits_first):
    """After a reboot the package's sysctl.d file sets `... %e %F` on every kernel (what install sets): csplice,
    started as the kernel starts it, records the crash and proves the process by its start time."""
    spool = tmp_path / "spool"
    host_core_settings.write_settings(render_settings({"spool_dir": str(spool), "min_free": 0, "max_pending": 0,
                                                       "max_per_exe_per_minute": 0}))
    with subprocess.Popen(["sleep", "60"]) as crashed:
        try:
            _, status = as_the_kernel(paths.csplice_path(), boot_pattern_argv(crashed.pid, kernel_splits_first),
                                      b"no core here\n" * 100)
        finally:
            crashed.kill()
    assert status == 0
    [name] = [n for n in os.listdir(spool) if n.endswith(".json")]
    record = json.loads((spool / name).read_text())
    assert record["pid"] == crashed.pid
    assert (record["proc"]["verified_by"], record["proc"]["verified"]) == ("start_time", True)

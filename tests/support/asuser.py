"""Running the CLI as another user, for the tests of what non-root users may see.

run_as forks this process and drops to the user's uid and gid (setgroups, setresgid, setresuid) before calling
corehandler.cli.main: from there on the kernel checks every open, stat and xattr as for that user, exactly as
after `runuser`. It needs no venv the user can execute (the test venv's interpreter may live under /root);
everything the CLI imports is imported here first, since the child may not read the venv's files.
run_as_program runs the installed CLI under `runuser` instead, when the user can execute this interpreter.
"""

from __future__ import annotations

import io
import os
import pwd
import subprocess
import sys
import tempfile
import traceback
from dataclasses import dataclass

import corehandler.cli
from corehandler.cli import main

corehandler.cli.build_parser()  # imports every verb module


@dataclass
class Result:
    returncode: int
    stdout: bytes
    stderr: bytes


def run_as(uid: int, gid: int, argv: list[str]) -> Result:
    with tempfile.TemporaryFile() as out, tempfile.TemporaryFile() as err:
        pid = os.fork()
        if pid == 0:  # pragma: no cover - the child; ends in os._exit
            code = 99
            try:
                os.dup2(out.fileno(), 1)
                os.dup2(err.fileno(), 2)
                sys.stdout = io.TextIOWrapper(io.FileIO(1, "w", closefd=False), encoding="utf-8", write_through=True)
                sys.stderr = io.TextIOWrapper(io.FileIO(2, "w", closefd=False), encoding="utf-8",
                                              errors="backslashreplace", write_through=True)
                os.setgroups([])
                os.setresgid(gid, gid, gid)
                os.setresuid(uid, uid, uid)
                os.chdir("/")
                code = main(argv)
            except BaseException:
                traceback.print_exc()
            finally:
                os._exit(code)
        _, status = os.waitpid(pid, 0)
        out.seek(0)
        err.seek(0)
        return Result(os.waitstatus_to_exitcode(status), out.read(), err.read())


def named_user(uid: int) -> str:
    """The name of uid, made (no home, no shell) when it has none: runuser takes names. nobody will not do: its
    dumps are nobody's to see (userview.ordinary_uid)."""
    try:
        return pwd.getpwuid(uid).pw_name
    except KeyError:
        name = f"corehandler-u{uid}"
        subprocess.run(["useradd", "--uid", str(uid), "--user-group", "--no-create-home", "--home-dir", "/nonexistent",
                        "--shell", "/usr/sbin/nologin", name], check=True, capture_output=True)
        return name


def program_runnable_by(user: str) -> str | None:
    """None when `runuser -u USER` can run this interpreter with corehandler; else why not."""
    try:
        probe = subprocess.run(["runuser", "-u", user, "--", sys.executable, "-P", "-c", "import corehandler"],
                               capture_output=True, text=True, timeout=60)
    except FileNotFoundError:
        return "runuser is not installed"
    if probe.returncode != 0:
        return (f"{user} cannot run the test venv's interpreter {sys.executable} ({probe.stderr.strip()}): a "
                "venv built from a Python under /root (0700); one built from the system's Python is runnable")
    return None


def run_as_program(user: str, argv: list[str]) -> subprocess.CompletedProcess:
    return subprocess.run(["runuser", "-u", user, "--", sys.executable, "-P", "-m", "corehandler", *argv],
                          capture_output=True, timeout=60, cwd="/")

"""Naming dumps on the command line (one rule for every verb: match.py) and showing the names processes
chose: bytes that are not UTF-8, newlines, terminal escapes. Real csplice records, ingested by the real daemon;
the CLI run as a program, the way a shell passes it bytes."""

from __future__ import annotations

import hashlib
import json
import os
import subprocess
import sys

import pytest

from corehandler import paths
from corehandler.cli import main
from corehandler.daemon import Settings
from corehandler.errors import EXIT_NOMATCH, EXIT_USAGE
from support import cbuild
from support.daemon_harness import Running, wait_for
from support.spoolfeed import empty_state, feed

CLI = [sys.executable, "-P", "-m", "corehandler"]
BAD = b"bad\xff\xfename"          # not UTF-8
TWIN = b"bad\\xff\\xfename"       # the same text as BAD escaped: another name
NEWLINE = b"a\nb/c"               # /proc's comm; the kernel's %e shows it as a\nb!c
ESCAPE_EXE = b"/opt/x\x1b[31m/prog"


def _fake_proc(root, pid, comm: bytes, exe: bytes | None = None):
    d = root / str(pid)
    d.mkdir(parents=True)
    (d / "comm").write_bytes(comm + b"\n")
    (d / "cmdline").write_bytes(comm + b"\0--flag\0")
    if exe is not None:
        os.symlink(exe, os.path.join(os.fsencode(d), b"exe"))
    return root


@pytest.fixture(scope="module")
def named(tmp_path_factory):
    feeder, csplice = cbuild.feeder(), paths.csplice_path()
    tmp = tmp_path_factory.mktemp("names")
    state, etc, settings = empty_state(tmp)
    shas = {}
    crashes = [(5001, NEWLINE.replace(b"/", b"!"), _fake_proc(tmp / "p1", 5001, NEWLINE)),
               (5002, BAD, None), (5003, TWIN, None),
               (5004, b"prog", _fake_proc(tmp / "p4", 5004, b"prog", ESCAPE_EXE))]
    for pid, comm, proc in crashes:
        r = feed(feeder, csplice, settings, size=(1 << 20) + pid, pid=pid, comm=comm, proc_root=proc)
        shas[pid] = hashlib.sha256((state / "spool" / r["core"]).read_bytes()).hexdigest()
    with Running(Settings(state, threads=1, sweep_interval=3600)):
        wait_for(lambda: not [n for n in os.listdir(state / "spool") if n.endswith(".json")])
    return state, etc, shas


def cli(named, *argv: str | bytes, check: bool = False) -> subprocess.CompletedProcess:
    state, etc, _ = named
    return subprocess.run(CLI + ["--config-dir", str(etc), "--state-dir", str(state), *argv],
                          capture_output=True, check=check, timeout=60)


def rows(out: bytes) -> list[list[str]]:
    """The table's rows, split in columns (TIME is three words): every row is one line."""
    return [line.split() for line in out.decode().splitlines()[1:]]


def test_a_name_that_is_not_utf8_is_found_byte_exact_and_printed_escaped(named):
    got = cli(named, "list", BAD)
    assert got.returncode == 0 and got.stderr == b""
    [row] = rows(got.stdout)
    assert row[3] == "5002" and row[-1] == "(bad\\xff\\xfename)"  # no exe: the comm, escaped, in brackets
    # The name spelled with backslashes is another name: each finds only itself.
    [twin] = rows(cli(named, "list", TWIN).stdout)
    assert twin[3] == "5003" and twin[-1] == "(bad\\\\xff\\\\xfename)"
    # JSON carries the bytes as the spool record does: lone surrogates (\udcXX escapes).
    [entry] = json.loads(cli(named, "--json", "list", BAD, check=True).stdout)
    assert entry["comm"].encode("utf-8", "surrogateescape") == BAD and "\\udcff" in json.dumps(entry)
    missing = cli(named, "list", b"bad\xff")
    assert missing.returncode == EXIT_NOMATCH and missing.stderr == b"corehandler: no dumps match bad\\xff\n"


def test_a_comm_with_a_newline_and_a_slash_is_found_by_its_real_name_and_never_printed_raw(named):
    for word in (NEWLINE, b"comm=" + NEWLINE, b"comm=a\nb!c"):  # /proc's name, and the kernel's %e form
        got = cli(named, "list", word)
        assert got.returncode == 0, (word, got.stderr)
        [row] = rows(got.stdout)
        assert row[3] == "5001" and row[-1] == "(a\\nb/c)", word
    info = cli(named, "info", NEWLINE, check=True).stdout.decode()
    fields = dict(line.strip().split(": ", 1) for line in info.splitlines() if ": " in line)
    assert fields["PID"] == "5001 (a\\nb/c)" and fields["Command Line"] == "'a\\nb/c' --flag"


def test_terminal_escapes_in_an_exe_are_escaped(named):
    got = cli(named, "list", ESCAPE_EXE, check=True)
    assert b"\x1b" not in got.stdout
    [row] = rows(got.stdout)
    assert row[3] == "5004" and row[-1] == "/opt/x\\x1b[31m/prog"
    info = cli(named, "info", "5004", check=True).stdout
    assert b"\x1b" not in info and b"Executable: /opt/x\\x1b[31m/prog" in info


def test_the_id_list_prints_names_the_dump_in_every_verb(named, tmp_path):
    _, _, shas = named
    table = rows(cli(named, "list", check=True).stdout)
    ids = {int(r[3]): r[-3] for r in table}  # ID, SIGNATURE, EXE end a row
    assert len(ids) == 4 and all("-" in i for i in ids.values())
    one = ids[5004]
    [row] = rows(cli(named, "list", one, check=True).stdout)
    assert row[3] == "5004"
    [entry] = json.loads(cli(named, "--json", "info", one, check=True).stdout)
    assert entry["id"] == one and entry["pid"] == 5004
    got = cli(named, "dump", one, check=True)
    assert hashlib.sha256(got.stdout).hexdigest() == shas[5004]
    # A unique prefix names it too (the pid ends every id, so cut the pid off the other's id).
    prefix = one[:one.rindex("-") + 2]
    assert [r[3] for r in rows(cli(named, "list", prefix, check=True).stdout)] == ["5004"]
    debugged = cli(named, "debug", one, "--debugger", sys.executable, "-A",
                   "-c 'import sys, hashlib; print(hashlib.sha256(open(sys.argv[-1], \"rb\").read()).hexdigest())'")
    assert debugged.returncode == 0 and debugged.stdout.decode().strip() == shas[5004]
    # A prefix every dump shares names none of them: refused, as git refuses an ambiguous hash.
    shared = os.path.commonprefix(list(ids.values()))
    refused = cli(named, "info", f"id={shared}")  # (digits alone are a PID)
    assert refused.returncode == EXIT_USAGE and b"ambiguous: 4 dumps" in refused.stderr


def test_minus_one_is_the_newest_for_every_verb(named, capsys):
    state, etc, shas = named
    base = ["--config-dir", str(etc), "--state-dir", str(state)]
    assert main(base + ["--json", "info", "-1"]) == 0
    [entry] = json.loads(capsys.readouterr().out)
    assert entry["pid"] == 5004
    assert main(base + ["--json", "info", "-n", "2"]) == 0
    assert [e["pid"] for e in json.loads(capsys.readouterr().out)] == [5003, 5004]
    got = cli(named, "dump", "-1", "5002", check=True)
    assert hashlib.sha256(got.stdout).hexdigest() == shas[5002]
    # Anything else that starts with '-' is an option argparse refuses, not a search.
    assert cli(named, "info", "-2").returncode == EXIT_USAGE


def test_help_documents_the_rule(named):
    for verb in ("list", "info", "dump", "debug"):
        text = cli(named, verb, "--help", check=True).stdout.decode()
        assert "unique id prefix" in text and "comm" in text, verb

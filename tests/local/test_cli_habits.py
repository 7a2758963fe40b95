"""coredumpctl's habits in corehandler's CLI: --no-legend, -r, -q, --json=short|pretty|off with coredumpctl's
list keys, `info` alone is the newest dump, the GID column, `gdb` and $SYSTEMD_DEBUGGER, FIELD=value matches
with journal field names, systemd.time(7) spans, and the pager on a terminal. Real csplice records, ingested
by the real daemon; the CLI run as a program."""

from __future__ import annotations

import hashlib
import json
import os
import pty
import select
import subprocess
import sys
import time

import pytest

from corehandler import paths
from corehandler.daemon import Settings
from corehandler.errors import EXIT_NOMATCH, EXIT_USAGE
from support import cbuild
from support.daemon_harness import Running, wait_for
from support.spoolfeed import empty_state, feed

CLI = [sys.executable, "-P", "-m", "corehandler"]
# pid, comm, signal, uid/gid, the unit its cgroup names
CRASHES = ((6001, "alpha", 11, 1201, "nginx.service"), (6002, "beta", 6, 1202, "cron.service"),
           (6003, "alpha", 6, 1201, None))


@pytest.fixture(scope="module")
def filled(tmp_path_factory):
    tmp = tmp_path_factory.mktemp("habits")
    state, etc, settings = empty_state(tmp)
    shas = {}
    for pid, comm, sig, uid, unit in CRASHES:
        proc = tmp / f"proc{pid}"
        (proc / str(pid)).mkdir(parents=True)
        if unit:
            (proc / str(pid) / "cgroup").write_text(f"0::/system.slice/{unit}\n")
        r = feed(cbuild.feeder(), paths.csplice_path(), settings, size=(1 << 20) + pid, pid=pid, comm=comm,
                 signal=sig, uid=uid, proc_root=proc)
        shas[pid] = hashlib.sha256((state / "spool" / r["core"]).read_bytes()).hexdigest()
        time.sleep(0.01)  # distinct crash times: the order is the test's
    with Running(Settings(state, threads=1, sweep_interval=3600)):
        wait_for(lambda: not [n for n in os.listdir(state / "spool") if n.endswith(".json")], timeout=60)
    return state, etc, shas


def cli(filled, *argv: str, env: dict | None = None) -> subprocess.CompletedProcess:
    state, etc, _ = filled
    return subprocess.run(CLI + ["--config-dir", str(etc), "--state-dir", str(state), *argv], capture_output=True,
                          text=True, timeout=60, env=env)


def pids(out: str, header: bool = True) -> list[int]:
    return [int(line.split()[3]) for line in out.splitlines()[1 if header else 0:]]


def test_list_has_gid_no_legend_and_reverse(filled):
    got = cli(filled, "list")
    header, *rows = got.stdout.splitlines()
    assert header.split()[:6] == ["TIME", "PID", "UID", "GID", "SIG", "STATUS"]
    assert [row.split()[3:7] for row in rows] == [[str(p), str(u), str(u), s] for p, _, sig, u, _ in CRASHES
                                                  for s in [{11: "SEGV", 6: "ABRT"}[sig]]]
    bare = cli(filled, "--no-legend", "list")
    assert bare.stdout.splitlines() == rows  # the same widths, no header
    assert pids(cli(filled, "list", "-r", "--no-legend").stdout, header=False) == [6003, 6002, 6001]
    assert pids(cli(filled, "list", "--reverse", "alpha").stdout) == [6003, 6001]


def test_json_modes_and_coredumpctl_list_keys(filled):
    short = cli(filled, "--json=short", "list")
    assert short.returncode == 0 and len(short.stdout.splitlines()) == 1
    rows = json.loads(short.stdout)
    state = filled[0]
    for row, (pid, comm, sig, uid, _) in zip(rows, CRASHES):
        # What `coredumpctl --json=short list` prints for a dump, beside corehandler's own keys.
        assert (row["pid"], row["uid"], row["gid"], row["sig"], row["corefile"]) == (pid, uid, uid, sig, "present")
        assert row["time"] == round(row["crashed_at"] * 1_000_000)
        assert row["size"] == (state / "store" / row["path"]).stat().st_size
    pretty = cli(filled, "--json=pretty", "list")
    assert json.loads(pretty.stdout) == rows and pretty.stdout.startswith("[\n  {")
    assert json.loads(cli(filled, "--json", "list").stdout) == rows  # --json alone is pretty
    assert json.loads(cli(filled, "list", "--json=short").stdout) == rows  # after the verb too
    off = cli(filled, "--json=off", "list")
    assert off.stdout.startswith("TIME ") and pids(off.stdout) == [6001, 6002, 6003]
    bad = cli(filled, "--json=long", "list")
    assert bad.returncode == EXIT_USAGE and "invalid choice: 'long'" in bad.stderr


def test_info_alone_is_the_newest_dump(filled):
    [newest] = json.loads(cli(filled, "--json=short", "info").stdout)
    assert newest["pid"] == 6003
    assert [d["pid"] for d in json.loads(cli(filled, "--json", "info", "alpha").stdout)] == [6001, 6003]
    assert [d["pid"] for d in json.loads(cli(filled, "--json", "info", "-r", "alpha").stdout)] == [6003, 6001]
    assert [d["pid"] for d in json.loads(cli(filled, "--json", "info", "-S", "-1h").stdout)] == [6001, 6002, 6003]


@pytest.mark.parametrize("words, expected", [
    (["COREDUMP_PID=6002"], [6002]),
    (["COREDUMP_COMM=alpha"], [6001, 6003]),
    (["COREDUMP_SIGNAL_NAME=SIGABRT"], [6002, 6003]),
    (["COREDUMP_SIGNAL=6", "COREDUMP_COMM=alpha"], [6003]),
    (["COREDUMP_UID=1202"], [6002]),
    (["COREDUMP_UNIT=nginx.service"], [6001]),
    (["COREDUMP_UNIT=cron.service", "beta"], [6002]),
])
def test_journal_field_matches(filled, words, expected):
    got = cli(filled, "list", *words)
    assert got.returncode == 0, got.stderr
    assert pids(got.stdout) == expected


def test_journal_field_matches_are_never_taken_for_a_comm(filled):
    none = cli(filled, "list", "COREDUMP_UNIT=sshd.service")
    assert none.returncode == EXIT_NOMATCH
    unknown = cli(filled, "list", "COREDUMP_HOSTNAME=testhost")
    assert unknown.returncode == EXIT_USAGE and "cannot match on the journal field COREDUMP_HOSTNAME" in unknown.stderr
    two = cli(filled, "list", "COREDUMP_UID=1201", "COREDUMP_UID=1202")
    assert two.returncode == EXIT_USAGE and "several uids" in two.stderr


@pytest.mark.parametrize("since, found", [("-7days", True), ("2 weeks ago", True), ("-1y", True),
                                          ("+1h", False), ("-1h 30min", True)])
def test_systemd_time_spans(filled, since, found):
    got = cli(filled, "list", "-S", since)
    assert got.returncode == (0 if found else EXIT_NOMATCH), got.stderr
    assert cli(filled, "list", "-U", "-2weeks").returncode == EXIT_NOMATCH


def test_gdb_alias_systemd_debugger_and_quiet(filled, tmp_path):
    _, _, shas = filled
    env = dict(os.environ, SYSTEMD_DEBUGGER=sys.executable)
    script = "import sys, hashlib; print(hashlib.sha256(open(sys.argv[-1], 'rb').read()).hexdigest())"
    got = cli(filled, "gdb", "beta", "-A", f"-c {script!r}", env=env)
    assert got.returncode == 0, got.stderr
    assert got.stdout.strip() == shas[6002]
    loud = cli(filled, "dump", "beta", "-o", str(tmp_path / "a"))
    assert loud.returncode == 0 and loud.stderr.startswith("wrote ")
    quiet = cli(filled, "-q", "dump", "beta", "-o", str(tmp_path / "b"))
    assert quiet.returncode == 0 and quiet.stderr == ""
    assert (tmp_path / "a").read_bytes() == (tmp_path / "b").read_bytes()


PAGER = """#!/bin/sh
{{ echo "LESS=$LESS"; cat; }} > {out}
"""


def on_terminal(filled, argv, env) -> str:
    """Runs the CLI with stdout on a terminal; what it wrote there."""
    state, etc, _ = filled
    leader, follower = pty.openpty()
    try:
        proc = subprocess.Popen(CLI + ["--config-dir", str(etc), "--state-dir", str(state), *argv], stdout=follower,
                                stderr=subprocess.PIPE, env=env)
        os.close(follower)
        out = b""
        while True:
            if select.select([leader], [], [], 30)[0]:
                try:
                    chunk = os.read(leader, 65536)
                except OSError:  # EIO: every writer is gone
                    break
                if not chunk:
                    break
                out += chunk
            else:
                break
        assert proc.wait(timeout=30) == 0, proc.stderr.read()
        proc.stderr.close()
    finally:
        os.close(leader)
    return out.decode()


def test_pager_on_a_terminal_as_systemd_chooses_it(filled, tmp_path):
    out = tmp_path / "paged"
    pager = tmp_path / "pager"
    pager.write_text(PAGER.format(out=out))
    pager.chmod(0o755)
    env = {k: v for k, v in os.environ.items() if k not in ("PAGER", "SYSTEMD_PAGER", "SYSTEMD_LESS", "LESS")}
    env["TERM"] = "xterm"
    on_terminal(filled, ["list"], dict(env, PAGER=str(pager)))
    first, *table = out.read_text().splitlines()
    assert first == "LESS=FRSXMK" and pids("\n".join(table)) == [6001, 6002, 6003]
    out.unlink()
    # $SYSTEMD_PAGER wins over $PAGER, and $SYSTEMD_LESS over the default.
    on_terminal(filled, ["--json", "info"], dict(env, PAGER="false", SYSTEMD_PAGER=str(pager), SYSTEMD_LESS="R"))
    first, *rest = out.read_text().splitlines()
    assert first == "LESS=R" and json.loads("\n".join(rest))[0]["pid"] == 6003
    out.unlink()
    # No pager: --no-pager, or a pager of "cat" or ""; the text goes to the terminal itself.
    for argv, extra in ((["--no-pager", "list"], {"PAGER": str(pager)}), (["list"], {"SYSTEMD_PAGER": "cat"}),
                        (["list"], {"PAGER": ""})):
        shown = on_terminal(filled, argv, dict(env, **extra))
        assert "alpha" in shown and not out.exists(), (argv, extra)
    # A dumb terminal (apt runs maintainer scripts on one), or a verb that does not show dumps: no pager either,
    # so `corehandler install` in a postinst never waits for a key.
    for argv, extra in ((["list"], {"TERM": "dumb"}), (["config", "show"], {})):
        shown = on_terminal(filled, argv, dict(env, PAGER=str(pager), **extra))
        assert shown and not out.exists(), (argv, extra)
    env_without_term = {k: v for k, v in env.items() if k != "TERM"}
    assert "alpha" in on_terminal(filled, ["list"], dict(env_without_term, PAGER=str(pager))) and not out.exists()
    # Not a terminal: never a pager.
    assert pids(cli(filled, "list", env=dict(env, PAGER=str(pager))).stdout) == [6001, 6002, 6003]
    assert not out.exists()


def terminal_table(filled, columns: int, *argv: str) -> list[str]:
    env = {k: v for k, v in os.environ.items() if k not in ("PAGER", "SYSTEMD_PAGER")}
    shown = on_terminal(filled, ["--no-pager", "list", *argv], dict(env, TERM="xterm", COLUMNS=str(columns)))
    return shown.replace("\r\n", "\n").splitlines()


WHOLE = ["TIME", "PID", "UID", "GID", "SIG", "STATUS", "COREFILE", "SIZE", "ID", "SIGNATURE", "EXE"]


@pytest.mark.parametrize("columns", [80, 120])
def test_list_fits_the_terminal_as_coredumpctl_does(filled, columns):
    from corehandler.cli.dumps import LIST_DROPS
    lines = terminal_table(filled, columns)
    header = lines[0].split()
    assert all(len(line) <= columns for line in lines), max(map(len, lines))
    # What goes, goes in the documented order; when, the names decide (the exe's path is the test's).
    dropped = [c for c in WHOLE if c not in header]
    assert set(dropped) == set(LIST_DROPS[:len(dropped)]) and dropped, header
    assert {"TIME", "PID", "SIG", "COREFILE", "EXE"} <= set(header)
    assert [int(line.split()[3]) for line in lines[1:]] == [6001, 6002, 6003]
    if columns == 120:
        assert "ID" in header
        # An id shortened to its microseconds is still a MATCH word every verb takes.
        short = lines[1].split()[header.index("ID") + 2]  # TIME is three words
        assert len(short) == 16
        got = cli(filled, "--json=short", "info", short)
        assert got.returncode == 0 and json.loads(got.stdout)[0]["pid"] == 6001, got.stderr


def test_list_is_whole_with_full_and_into_a_pipe(filled):
    whole = WHOLE
    full = terminal_table(filled, 80, "--full")
    assert full[0].split() == whole and max(map(len, full)) > 80
    piped = cli(filled, "list", env=dict(os.environ, COLUMNS="80"))
    assert piped.stdout.splitlines()[0].split() == whole
    ids = [d["id"] for d in json.loads(cli(filled, "--json=short", "list").stdout)]
    assert [line.split()[10] for line in piped.stdout.splitlines()[1:]] == ids  # whole ids into a pipe


def test_size_is_what_the_dump_takes_on_disk(filled):
    from corehandler.units import human_size
    state = filled[0]
    rows = json.loads(cli(filled, "--json=short", "list").stdout)
    lines = cli(filled, "list").stdout.splitlines()[1:]
    stored = [human_size((state / "store" / r["path"]).stat().st_size) for r in rows]
    assert [line.split()[9] for line in lines] == stored
    assert any(r["stored_bytes"] != r["raw_bytes"] for r in rows)  # compressed: the two sizes differ


def test_quiet_is_silent_and_words_with_equals_are_journal_matches(filled, tmp_path):
    env = dict(os.environ, SYSTEMD_DEBUGGER="true")
    assert "debugging" in cli(filled, "gdb", "beta", env=env).stderr
    quiet = cli(filled, "-q", "gdb", "beta", env=env)
    assert quiet.returncode == 0 and quiet.stderr == ""
    trusted = cli(filled, "list", "_COMM=alpha")
    assert trusted.returncode == EXIT_USAGE and "match COREDUMP_COMM=alpha" in trusted.stderr
    loose = cli(filled, "list", "alpha=1")
    assert loose.returncode == EXIT_USAGE and "comm=alpha=1" in loose.stderr
    assert cli(filled, "list", "comm=alpha=1").returncode == EXIT_NOMATCH
    assert cli(filled, "list", "./no=such/exe").returncode == EXIT_NOMATCH  # a path may hold '='

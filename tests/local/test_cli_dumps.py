"""list, info, dump, debug, vacuum and serve on a state dir the real daemon filled from csplice records."""

from __future__ import annotations

import functools
import hashlib
import json
import os
import pty
import subprocess
import sys
import time
from pathlib import Path

import pytest
from prometheus_client.parser import text_string_to_metric_families

from corehandler import paths
from corehandler.cli import main
from corehandler.daemon import Settings
from corehandler.errors import EXIT_CONFIG, EXIT_NOMATCH, EXIT_PERMISSION, EXIT_SYSTEM, EXIT_USAGE
from corehandler.observe.metrics import MetricsObserver
from corehandler.store.index import Store
from support import cbuild, daemon_harness
from support.asuser import run_as
from support.daemon_harness import Running, wait_for
from support.spoolfeed import empty_state, fed_state, feed, write_settings

CLI = [sys.executable, "-P", "-m", "corehandler"]


@pytest.fixture(scope="module")
def filled(tmp_path_factory):
    """Four dumps: two of "alpha" (SIGSEGV, then SIGABRT), one "beta", one metadata-only "gamma" (SIGFPE)."""
    feeder, csplice = cbuild.feeder(), paths.csplice_path()
    tmp = tmp_path_factory.mktemp("cli")
    state, etc, settings = empty_state(tmp)
    one = write_settings(tmp / "one.conf", state / "spool", max_pending=2)  # three pending: metadata only
    shas = {}
    for pid, comm, sig in ((3001, "alpha", 11), (3002, "alpha", 6), (3003, "beta", 11)):
        r = feed(feeder, csplice, settings, size=(3 << 20) + pid, pid=pid, comm=comm, signal=sig,
                 zero_regions=True)
        shas[pid] = hashlib.sha256((state / "spool" / r["core"]).read_bytes()).hexdigest()
    feed(feeder, csplice, one, size=4096, pid=3004, comm="gamma", signal=8)
    with Running(Settings(state, threads=1, sweep_interval=3600)):
        wait_for(lambda: not [n for n in os.listdir(state / "spool") if n.endswith(".json")])
    return state, etc, shas


def run(capsys, filled, *argv):
    state, etc, _ = filled
    code = main(["--config-dir", str(etc), "--state-dir", str(state), *argv])
    out, err = capsys.readouterr()
    return code, out, err


def pids(out: str) -> list[int]:
    return [int(line.split()[3]) for line in out.splitlines()[1:]]


def test_list_is_the_default_verb(capsys, filled):
    code, out, _ = run(capsys, filled)
    assert code == 0
    assert out.splitlines()[0].split() == ["TIME", "PID", "UID", "GID", "SIG", "STATUS", "COREFILE", "SIZE", "ID",
                                          "SIGNATURE", "EXE"]
    assert pids(out) == [3001, 3002, 3003, 3004]
    assert "dropped  none" in out.splitlines()[4]


@pytest.mark.parametrize("argv,expected", [
    (["alpha"], [3001, 3002]),
    (["3003"], [3003]),
    (["pid=3001", "pid=3003"], [3001, 3003]),
    (["comm=alpha", "3002"], [3002]),
    (["--signal", "SIGABRT"], [3002]),
    (["--signal", "segv"], [3001, 3003]),
    (["--signal", "11", "-1"], [3003]),
    (["-n", "2"], [3003, 3004]),
    (["alpha", "-1"], [3002]),
    (["--since=-1h"], [3001, 3002, 3003, 3004]),
    (["--signal", "FPE"], [3004]),
    (["--until", "@0"], []),
    (["--since", "2000-01-01", "--until", "now"], [3001, 3002, 3003, 3004]),
])
def test_list_filters(capsys, filled, argv, expected):
    code, out, err = run(capsys, filled, "list", *argv)
    if expected:
        assert code == 0 and pids(out) == expected
    else:
        assert code == EXIT_NOMATCH and err.strip() == "corehandler: no dumps match"


def test_list_by_id_prefix_and_json(capsys, filled):
    code, out, _ = run(capsys, filled, "--json", "list", "beta")
    [row] = json.loads(out)
    assert (row["pid"], row["comm"], row["signal"], row["status"], row["corefile"]) == \
        (3003, "beta", 11, "ok", "present")
    code, out, _ = run(capsys, filled, "list", f"id={row['id']}")
    assert code == 0 and pids(out) == [3003]


@pytest.mark.parametrize("argv", [["--since", "yesterdayish"], ["--signal", "SIGFOO"], ["pid=abc"],
                                  ["--signal", "9" * 20], ["pid=" + "9" * 20]])
def test_usage_errors(capsys, filled, argv):
    code, _, err = run(capsys, filled, "list", *argv)
    assert code == EXIT_USAGE and len(err.splitlines()) == 1 and err.startswith("corehandler: ")


def test_info_human_and_json(capsys, filled):
    code, out, _ = run(capsys, filled, "info", "beta")
    assert code == 0
    fields = dict(line.strip().split(": ", 1) for line in out.split("\n\n")[0].splitlines())
    assert fields["PID"] == "3003 (beta)" and fields["Signal"] == "11 (SEGV)" and fields["Status"] == "ok"
    assert fields["Core File"] == "present" and "compressed" in fields["Storage"]
    code, out, _ = run(capsys, filled, "--json", "info", "gamma")
    [info] = json.loads(out)
    assert info["status"] == "dropped" and info["corefile"] == "none"
    assert info["record"]["capture"]["dropped_reason"] == "max_pending"


def test_dump_to_file_and_pipe_is_byte_identical(capsys, filled, tmp_path):
    state, etc, shas = filled
    out = tmp_path / "core"
    code, _, err = run(capsys, filled, "dump", "3001", "-o", str(out))
    assert code == 0 and "wrote" in err
    assert hashlib.sha256(out.read_bytes()).hexdigest() == shas[3001]
    assert out.stat().st_blocks * 512 < out.stat().st_size  # zero regions came back as holes
    proc = subprocess.run(CLI + ["--config-dir", str(etc), "--state-dir", str(state), "dump", "alpha"],
                          capture_output=True, check=True)
    assert hashlib.sha256(proc.stdout).hexdigest() == shas[3002]  # the newest match


def test_dump_refuses_a_terminal_and_a_dropped_dump(capsys, filled, tmp_path):
    state, etc, _ = filled
    leader, follower = pty.openpty()
    try:
        proc = subprocess.run(CLI + ["--config-dir", str(etc), "--state-dir", str(state), "dump", "beta"],
                              stdout=follower, stderr=subprocess.PIPE, text=True)
    finally:
        os.close(follower)
        os.close(leader)
    assert proc.returncode == EXIT_USAGE and "refusing to write a core to a terminal" in proc.stderr
    code, _, err = run(capsys, filled, "dump", "gamma", "-o", str(tmp_path / "x"))
    assert code == EXIT_NOMATCH and "has no stored core (dropped)" in err
    assert not (tmp_path / "x").exists()


def test_debug_hands_the_debugger_the_core(capsys, filled, tmp_path):
    """The "debugger" here is python printing the sha256 of the core it was given, and where it was."""
    state, etc, shas = filled
    script = "import sys, hashlib; print(hashlib.sha256(open(sys.argv[-1], 'rb').read()).hexdigest(), sys.argv[-1])"
    proc = subprocess.run(CLI + ["--config-dir", str(etc), "--state-dir", str(state), "debug", "beta",
                                 "--debugger", sys.executable, "-A", f"-c {script!r}"],
                          capture_output=True, text=True, check=True)
    digest, core = proc.stdout.split()
    assert digest == shas[3003]
    assert not Path(core).exists() and not Path(core).parent.exists()  # the private copy is gone


def test_debug_with_a_missing_debugger(capsys, filled):
    code, _, err = run(capsys, filled, "debug", "beta", "--debugger", "no-such-debugger-x")
    assert code == EXIT_SYSTEM and err.strip() == "corehandler: debugger 'no-such-debugger-x' not found"


def test_vacuum_dry_run_then_real(capsys, filled, tmp_path):
    """Retention takes the oldest full core and leaves its mini core (list: COREFILE mini; info and debug say
    so; debug opens it); the mini rules then take the dump."""
    state, etc, _ = filled
    (etc / "corehandler.toml").write_text("[retention]\nmax_count = 3\n")
    script = "import sys, hashlib; print(hashlib.sha256(open(sys.argv[-1], 'rb').read()).hexdigest())"
    try:
        code, out, _ = run(capsys, filled, "vacuum", "--dry-run")
        assert code == 0 and out.splitlines()[0].startswith("would delete ") and ": max_count" in out
        assert len(Store(state).all()) == 4
        code, out, _ = run(capsys, filled, "--json", "vacuum")
        result = json.loads(out)
        assert [(d["rule"], d["kept_mini"]) for d in result["deleted"]] == [("max_count", True)]
        assert result["store_dumps"] == 4
        code, out, _ = run(capsys, filled, "list")
        assert pids(out) == [3001, 3002, 3003, 3004] and out.splitlines()[1].split()[7:9] == ["ok", "mini"]
        code, out, _ = run(capsys, filled, "info", "3001")
        fields = dict(line.strip().split(": ", 1) for line in out.split("\n\n")[0].splitlines())
        assert fields["Core File"] == "mini" and fields["Storage"].startswith("mini core only")
        (dump,) = Store(state).query()[:1]
        assert dump.path is None and dump.stored_bytes == 0 and dump.mini_bytes > 0
        mini = state / "store" / dump.mini_path
        proc = subprocess.run(CLI + ["--config-dir", str(etc), "--state-dir", str(state), "debug", "3001",
                                     "--debugger", sys.executable, "-A", f"-c {script!r}"],
                              capture_output=True, text=True, check=True)
        assert proc.stdout.split() == [hashlib.sha256(mini.read_bytes()).hexdigest()]
        assert "from the mini core" in proc.stderr
        code, _, err = run(capsys, filled, "dump", "3001", "-o", str(tmp_path / "x"))
        assert code == EXIT_NOMATCH and "only its mini core is left" in err
        (etc / "corehandler.toml").write_text("[retention]\nmax_count = 3\nmini_max_count = 0\nmini_max_use = 1\n")
        code, out, _ = run(capsys, filled, "--json", "vacuum")
        assert [d["rule"] for d in json.loads(out)["deleted"]] == ["mini_max_use"] and not mini.exists()
        code, out, _ = run(capsys, filled, "list")
        assert pids(out) == [3002, 3003, 3004]
        assert {rule: n for rule, (n, _) in Store(state).deletions().items()} == {"max_count": 1, "mini_max_use": 1}
    finally:
        (etc / "corehandler.toml").unlink()


def test_serve_refuses_an_invalid_config(capsys, filled):
    state, etc, _ = filled
    (etc / "corehandler.toml").write_text("[compression]\nlevel = 99\n")
    try:
        code, _, err = run(capsys, filled, "serve")
    finally:
        (etc / "corehandler.toml").unlink()
    assert code == EXIT_CONFIG
    assert len(err.splitlines()) == 1 and "compression.level" in err and "corehandler.toml" in err


def test_dump_to_an_unwritable_place_is_one_line(capsys, filled, tmp_path):
    code, _, err = run(capsys, filled, "dump", "-o", str(tmp_path / "absent" / "core"))
    assert code == EXIT_SYSTEM and err == f"corehandler: cannot write {tmp_path / 'absent' / 'core'}: " \
        "No such file or directory\n"


def test_an_index_damaged_past_its_header_is_one_line(capsys, filled, tmp_path):
    state, etc, _ = filled
    copy = tmp_path / "state"
    copy.mkdir()
    data = bytearray((state / "index.sqlite").read_bytes())
    page = 4096
    assert len(data) > page  # the header page survives; every page after it is garbage
    data[page:] = b"\xff" * (len(data) - page)
    (copy / "index.sqlite").write_bytes(bytes(data))
    code = main(["--config-dir", str(etc), "--state-dir", str(copy), "list"])
    _, err = capsys.readouterr()
    # Opening it reads past the header now (the version that wrote it): the damage shows there, or at the query.
    assert code == EXIT_SYSTEM and err.startswith(("corehandler: the index is damaged", "corehandler: cannot open "
                                                   f"the index {copy / 'index.sqlite'}: database disk image is "
                                                   "malformed")) and len(err.splitlines()) == 1


def test_corrupt_store_files_are_reported_not_crashed_on(capsys, filled, tmp_path):
    """Runs last in this module: it damages the store. A flipped byte in the middle: dump writes not one byte
    to a pipe nor leaves a file; info says corrupt in Status and exits 6; list, status and JSON show it from
    then on (the mark is in the index), though list's cheap check alone cannot see a flipped byte; a
    truncated file shows in list (size and header check) too."""
    state, etc, _ = filled
    with Store(state) as s:
        beta = next(d for d in s.all() if d.comm == "beta")
    path = state / "store" / beta.path
    data = bytearray(path.read_bytes())
    data[len(data) // 2] ^= 0xFF
    path.write_bytes(bytes(data))
    piped = subprocess.run(CLI + ["--config-dir", str(etc), "--state-dir", str(state), "dump", "beta"],
                           capture_output=True, timeout=60)
    assert piped.returncode == EXIT_SYSTEM and piped.stdout == b"" and len(piped.stderr.splitlines()) == 1
    code, _, err = run(capsys, filled, "dump", "beta", "-o", str(tmp_path / "x"))
    assert code == EXIT_SYSTEM and len(err.splitlines()) == 1 and not (tmp_path / "x").exists()
    assert os.listdir(tmp_path) == []
    code, out, err = run(capsys, filled, "info", "beta")
    fields = dict(line.strip().split(": ", 1) for line in out.splitlines() if ": " in line)
    assert code == EXIT_SYSTEM and fields["Status"] == "corrupt" and fields["Core File"].startswith("corrupt: ")
    assert err.startswith("corehandler: the stored file of 1 of 1 dumps is corrupt")
    code, out, _ = run(capsys, filled, "list", "beta")
    assert code == 0 and out.splitlines()[1].split()[7:9] == ["corrupt", "corrupt"]
    for verb in ("list", "info"):  # one status in every form
        code, out, _ = run(capsys, filled, "--json", verb, "beta")
        assert [(d["status"], d["corefile"]) for d in json.loads(out)] == [("corrupt", "corrupt")]
    code, out, _ = run(capsys, filled, "--json", "status")
    assert json.loads(out)["store"]["corrupt"] == 1
    code, out, _ = run(capsys, filled, "status")
    assert "1 corrupt" in next(line for line in out.splitlines() if line.startswith("store:"))
    path.write_bytes(bytes(data[:len(data) // 3]))
    code, out, _ = run(capsys, filled, "list", "beta")
    assert code == 0 and " corrupt " in out
    code, out, _ = run(capsys, filled, "--json", "list", "beta")
    assert json.loads(out)[0]["corefile"] == "corrupt"


@pytest.mark.parametrize("text, shown", [
    ("0::/system.slice/nginx.service\n", "/system.slice/nginx.service"),
    ("4:memory:/docker/abc\n0::/init.scope\n", "/init.scope"),
    ("12:name=systemd:/user.slice\n4:memory:/x\n", "/user.slice"),
    ("", None), (None, None),
])
def test_info_shows_the_cgroup_path_as_coredumpctl_does(text, shown):
    from corehandler.cli.dumps import _cgroup

    assert _cgroup(text) == shown


def test_the_daemon_sees_what_the_cli_did_at_the_next_scrape(tmp_path, capsys):
    """A `vacuum` and a corruption found by `info`, both from the CLI: the running daemon's store gauges
    read the index at scrape time, and its errors_total{kind="corrupt"} counts the mark once."""
    state, etc = fed_state(tmp_path, (3101, 3102, 3103), "gauge")
    metrics = MetricsObserver(state_dir=state)
    base = ["--config-dir", str(etc), "--state-dir", str(state)]
    sample = functools.partial(daemon_harness.sample, metrics)

    with Running(Settings(state, threads=1, sweep_interval=0.1), [metrics]):
        wait_for(lambda: sample("corehandler_store_dumps") == 3, what="three dumps indexed")

        def all_stored():
            with Store(state) as s:
                return all(d.path for d in s.all())

        # Listed before stored (status compressing): vacuum and the corruption need the stored files.
        wait_for(all_stored, what="three dumps stored")
        # max_count takes the oldest full core, mini_max_use then its mini core and row
        (etc / "corehandler.toml").write_text("[retention]\nmax_count = 2\nmini_max_use = 1\n")
        assert main(base + ["vacuum"]) == 0
        assert sample("corehandler_store_dumps") == 2  # no daemon event in between
        with Store(state) as s:
            newest = s.all()[-1]
        path = state / "store" / newest.path
        data = bytearray(path.read_bytes())
        data[len(data) // 2] ^= 0xFF
        path.write_bytes(bytes(data))
        assert main(base + ["info", "3103"]) == EXIT_SYSTEM
        assert sample("corehandler_store_corrupt_dumps") == 1
        wait_for(lambda: sample("corehandler_errors_total", kind="corrupt") == 1, what="the mark counted")
    capsys.readouterr()


def test_build_info_names_the_csplice_version(tmp_path):
    from corehandler.cli.serve import observers_for
    from corehandler.config import Config

    config = Config.model_validate({"metrics": {"enabled": False, "textfile": str(tmp_path / "m.prom")},
                                    "journal": {"enabled": False}, "scrub": {"enabled": False}})
    observers, problems = observers_for(config, paths.Paths(state_dir=tmp_path / "state"), lambda: None)
    [observer] = [o for o in observers if isinstance(o, MetricsObserver)]
    expected = subprocess.run([str(paths.csplice_path()), "--version"], capture_output=True, text=True,
                              check=True).stdout.strip()
    assert expected and problems == []
    [labels] = [s.labels for family in text_string_to_metric_families(observer.exposition().decode())
                for s in family.samples if s.name == "corehandler_build_info"]
    assert labels["csplice_version"] == expected


def test_the_corrupt_count_follows_the_store_and_delete_removes_exactly_the_match(tmp_path, capsys):
    """The corrupt-dumps gauge falls when a corrupt dump passes a whole check again, loses its full core to
    retention, or is deleted; `delete` removes exactly what its MATCH names (root only, never without one)."""
    state, etc = fed_state(tmp_path, (3201, 3202, 3203, 3204), "counts")
    metrics = MetricsObserver(state_dir=state)
    base = ["--config-dir", str(etc), "--state-dir", str(state)]
    sample = functools.partial(daemon_harness.sample, metrics)

    def stored() -> dict[int, Path]:
        with Store(state) as s:
            return {d.pid: state / "store" / d.path for d in s.all() if d.path}

    def damage(path: Path) -> bytes:
        data = path.read_bytes()
        path.write_bytes(data[:len(data) // 2] + bytes([data[len(data) // 2] ^ 0xFF]) + data[len(data) // 2 + 1:])
        return data

    with Running(Settings(state, threads=1, sweep_interval=3600), [metrics]):
        wait_for(lambda: len(stored()) == 4, what="four dumps stored")
        files = stored()
        good = damage(files[3201])
        assert main(base + ["info", "3201"]) == EXIT_SYSTEM
        assert sample("corehandler_store_corrupt_dumps") == 1
        files[3201].write_bytes(good)  # restored from a backup: a whole check forgets the mark
        assert main(base + ["info", "3201"]) == 0
        assert sample("corehandler_store_corrupt_dumps") == 0

        damage(files[3201])
        assert main(base + ["info", "3201"]) == EXIT_SYSTEM
        with Store(state) as s:
            [d] = [d for d in s.all() if d.pid == 3201]
            assert s.drop_full_core(d, "max_count") is not None  # what retention does to keep the mini core
        assert sample("corehandler_store_corrupt_dumps") == 0

        damage(files[3202])
        assert main(base + ["info", "3202"]) == EXIT_SYSTEM
        untouched = {pid: hashlib.sha256(files[pid].read_bytes()).hexdigest() for pid in (3203, 3204)}
        capsys.readouterr()
        assert main(base + ["delete", "--dry-run", "3202"]) == 0
        assert "would delete" in capsys.readouterr().out and files[3202].exists()
        assert sample("corehandler_store_corrupt_dumps") == 1
        assert main(base + ["delete"]) == EXIT_USAGE  # never every dump by accident: that is vacuum
        denied = run_as(65534, 65534, base + ["delete", "3203"])
        assert denied.returncode == EXIT_PERMISSION and files[3203].exists()
        assert main(base + ["delete", "3202"]) == 0
        assert not files[3202].exists()
        assert sample("corehandler_store_corrupt_dumps") == 0
        with Store(state) as s:
            assert sorted(d.pid for d in s.all()) == [3201, 3203, 3204]
            assert s.deletions()["delete"][0] == 1
        assert {pid: hashlib.sha256(files[pid].read_bytes()).hexdigest() for pid in (3203, 3204)} == untouched
        assert main(base + ["delete", "3202"]) == EXIT_NOMATCH
    capsys.readouterr()


def test_max_age_takes_the_mini_cores_too_unless_mini_max_age_keeps_them(capsys, tmp_path):
    """An admin's max_age covers the whole dump: the mini core (stacks and registers) goes with the full one;
    a longer mini_max_age keeps it."""
    feeder, csplice = cbuild.feeder(), paths.csplice_path()
    state, etc, settings = empty_state(tmp_path)
    for pid in (3101, 3102):
        feed(feeder, csplice, settings, size=(1 << 20) + pid, pid=pid, comm="aged", signal=11, zero_regions=True)
    with Running(Settings(state, threads=1, sweep_interval=3600)):
        wait_for(lambda: not [n for n in os.listdir(state / "spool") if n.endswith(".json")])
    minis = [state / "store" / d.mini_path for d in Store(state).all()]
    assert len(minis) == 2 and all(m.exists() for m in minis)
    time.sleep(1.1)
    filled = (state, etc, None)

    (etc / "corehandler.toml").write_text('[retention]\nmax_age = "1s"\nmini_max_age = "1h"\n')
    code, out, _ = run(capsys, filled, "--json", "vacuum")
    assert code == 0 and [(d["rule"], d["kept_mini"]) for d in json.loads(out)["deleted"]] == [("max_age", True)] * 2
    assert all(m.exists() for m in minis) and len(Store(state).all()) == 2

    (etc / "corehandler.toml").write_text('[retention]\nmax_age = "1s"\n')
    code, out, _ = run(capsys, filled, "--json", "vacuum")
    assert code == 0 and [d["rule"] for d in json.loads(out)["deleted"]] == ["mini_max_age"] * 2
    assert not any(m.exists() for m in minis) and Store(state).all() == []

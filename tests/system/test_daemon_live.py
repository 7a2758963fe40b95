"""The whole path on the live kernel: real crashes through core_pattern into csplice, `corehandler serve`
ingesting them, and the CLI giving them back: listed, byte-identical, debuggable in gdb."""

from __future__ import annotations

import hashlib
import json
import os
import signal
import subprocess
import sys
import threading
from pathlib import Path

import pytest

from corehandler import elfcore, paths
from corehandler.csplice_contract import SPECIFIERS
from support.crash import build_crasher, crash
from support.daemon_harness import wait_for

pytestmark = [pytest.mark.root, pytest.mark.live_kernel]

CLI = [sys.executable, "-P", "-m", "corehandler"]


def sha_of(path: Path) -> str:
    h = hashlib.sha256()
    with open(path, "rb") as f:
        while chunk := f.read(1 << 20):
            h.update(chunk)
    return h.hexdigest()


@pytest.fixture
def live(tmp_path, host_core_settings):
    """core_pattern pointing at this venv's csplice, a private config and state dir; `cli(...)` runs the
    CLI on them. csplice.conf is written by `serve` (from the config) or here before it runs."""
    etc, state = tmp_path / "etc", tmp_path / "state"
    etc.mkdir()
    (etc / "corehandler.toml").write_text(
        "[capture]\nmin_free = \"0\"\nmax_per_exe_per_minute = 0\n[metrics]\nenabled = false\n"
        "[journal]\nenabled = false\n[retention]\nkeep_free = \"0\"\nmax_use = \"0\"\n")
    pattern = f"|{paths.csplice_path()} {SPECIFIERS}"
    assert len(pattern) < 128
    Path("/proc/sys/kernel/core_pattern").write_text(pattern)
    Path("/proc/sys/kernel/core_pipe_limit").write_text("16")
    base = CLI + ["--config-dir", str(etc), "--state-dir", str(state)]

    def cli(*argv, **kw):
        return subprocess.run(base + list(argv), capture_output=True, **kw)

    yield state, etc, cli, base


def serve(base):
    """`corehandler serve`, returned once it watches the spool. Its log lines arrive in .lines as it writes
    them (a reader thread), so a test waits for what the daemon says instead of sleeping."""
    proc = subprocess.Popen(base + ["serve", "--sweep-interval", "1"], stdout=subprocess.DEVNULL,
                            stderr=subprocess.PIPE, text=True)
    proc.lines = []
    while not proc.lines or "Watching" not in proc.lines[-1]:
        line = proc.stderr.readline()
        assert line, f"serve exited: {proc.lines}"
        proc.lines.append(line)
    proc.reader = threading.Thread(target=lambda: proc.lines.extend(iter(proc.stderr.readline, "")), daemon=True)
    proc.reader.start()
    return proc


def logged(proc, text: str) -> bool:
    return any(text in line for line in list(proc.lines))


def stop(proc):
    proc.send_signal(signal.SIGTERM)
    try:
        assert proc.wait(30) == 0
    finally:
        proc.kill()
    proc.reader.join(30)
    return "".join(proc.lines)


def spool_records(state: Path) -> list[str]:
    spool = state / "spool"
    return sorted(n for n in os.listdir(spool) if n.endswith(".json") and not n.startswith(".")) \
        if spool.exists() else []


def test_crashes_are_ingested_listed_dumped_and_debuggable(live, tmp_path):
    state, etc, cli, base = live
    crasher = build_crasher(tmp_path / "bin")
    # First crash with no daemon running: csplice spools it; its raw core is the reference.
    proc = serve(base)  # writes csplice.conf for this state dir, then is stopped
    wait_for(lambda: (state / "spool").exists() and paths.CSPLICE_SETTINGS.exists(), what="serve started")
    stop(proc)
    assert f"spool_dir={state / 'spool'}" in paths.CSPLICE_SETTINGS.read_text()
    r = crash(crasher, "segv", mib=16)
    assert r.returncode == -signal.SIGSEGV
    wait_for(lambda: len(spool_records(state)) == 1, what="the crash in the spool")
    [record_name] = spool_records(state)
    record = json.loads((state / "spool" / record_name).read_text())
    raw_sha = sha_of(state / "spool" / record["core"])
    assert record["proc"]["exe"] == str(crasher)
    # The kernel's own core, as elfcore reads it: the notes name the process, its signal and its files.
    info = elfcore.inspect_core(state / "spool" / record["core"])
    assert (info.status, info.problems, info.elf_class) == ("ok", [], 64)
    assert (info.signal, info.fname) == (signal.SIGSEGV, crasher.name[:15])
    assert info.pid == record["pid"] and str(crasher) in info.files

    proc = serve(base)
    try:
        wait_for(lambda: not spool_records(state), what="ingest of the spooled crash")
        # A second crash while the daemon runs: picked up through inotify.
        r2 = crash(crasher, "abort", mib=4)
        assert r2.returncode == -signal.SIGABRT
        # Listed as soon as it is analysed, then stored: wait for both to be stored.
        wait_for(lambda: [d["status"] for d in json.loads(cli("--json", "list").stdout or "[]")] == ["ok", "ok"],
                 what="second dump indexed and stored")
    finally:
        log = stop(proc)
    assert "Ingested" in log

    listed = json.loads(cli("--json", "list").stdout)
    assert [(d["pid"], d["signal"], d["status"], d["exe"], d["corefile"]) for d in listed] == [
        (record["pid"], 11, "ok", str(crasher), "present"), (listed[1]["pid"], 6, "ok", str(crasher), "present")]
    assert listed[0]["stored_bytes"] < listed[0]["raw_bytes"] // 4  # the 16 MiB pattern compresses
    human = cli("list", str(crasher)).stdout.decode()
    assert human.count(str(crasher)) == 2

    out = tmp_path / "core"
    assert cli("dump", str(record["pid"]), "-o", str(out)).returncode == 0
    assert sha_of(out) == raw_sha  # byte-identical to what csplice captured before ingest
    piped = subprocess.run(base + ["dump", str(record["pid"])], stdout=subprocess.PIPE, check=True).stdout
    assert hashlib.sha256(piped).hexdigest() == raw_sha

    info = cli("info", str(record["pid"])).stdout.decode()
    assert "Core File: present" in info and f"Executable: {crasher}" in info

    gdb = cli("debug", str(record["pid"]), "-A", "-batch -ex bt", timeout=120)
    text = gdb.stdout.decode() + gdb.stderr.decode()
    assert gdb.returncode == 0, text
    assert "crash_here_segv" in text and "main" in text


def test_sighup_reloads_config_and_rewrites_csplice_settings(live, tmp_path):
    state, etc, cli, base = live
    crasher = build_crasher(tmp_path / "bin")
    proc = serve(base)
    try:
        wait_for(lambda: paths.CSPLICE_SETTINGS.exists() and "spool_dir=" + str(state / "spool")
                 in paths.CSPLICE_SETTINGS.read_text(), what="csplice.conf for this state dir")
        toml = etc / "corehandler.toml"
        toml.write_text(toml.read_text().replace("[capture]\n", "[capture]\nmax_dump_size = \"1M\"\n")
                        + "[compression]\nenabled = false\n")
        proc.send_signal(signal.SIGHUP)
        wait_for(lambda: "max_dump_size=1048576" in paths.CSPLICE_SETTINGS.read_text(), what="reload")
        crash(crasher, "segv", mib=8)
        wait_for(lambda: len(json.loads(cli("--json", "list").stdout or "[]")) == 1, what="dump indexed")
        # A broken config on SIGHUP: the daemon keeps running on the old one and says why.
        good = toml.read_text()
        toml.write_text("[compression]\nlevel = 99\n")
        proc.send_signal(signal.SIGHUP)
        wait_for(lambda: logged(proc, "Reload failed, keeping the running configuration"), what="refused reload")
        assert proc.poll() is None
        assert "max_dump_size=1048576" in paths.CSPLICE_SETTINGS.read_text()  # left as it was
        toml.write_text(good)
    finally:
        log = stop(proc)
    [dump] = json.loads(cli("--json", "list").stdout)
    assert dump["status"] == "truncated" and dump["path"].endswith(".core")  # 1M cap, stored raw
    assert dump["raw_bytes"] == 1 << 20 and "capture truncated: max_dump_size" in dump["problem"]
    assert "Reload failed, keeping the running configuration" in log and "compression.level" in log

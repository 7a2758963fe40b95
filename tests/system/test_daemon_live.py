"""The whole path on the live kernel: real crashes through core_pattern into csplice, `corehandler serve`
ingesting them, and the CLI giving them back: listed, byte-identical, debuggable in gdb. And one owner of the
host: a second installation's daemon (`--state-dir D serve`, D never installed) ingests D's spool only and
never changes what the kernel does with a crash (issue 33)."""

from __future__ import annotations

import hashlib
import json
import os
import resource
import shutil
import signal
import subprocess
import sys
import tempfile
import threading
from pathlib import Path

import pytest

from corehandler import elfcore
from corehandler.csplice_contract import parse_settings
from corehandler.host import handler, sysctl
from corehandler.paths import Host
from support.crash import build_crasher, crash
from support.daemon_harness import wait_for

pytestmark = [pytest.mark.root, pytest.mark.live_kernel]

CLI = [sys.executable, "-P", "-m", "corehandler"]
SETTINGS = Host().csplice_settings
USER = 4321  # an ordinary uid; the kernel needs no passwd entry


def sha_of(path: Path) -> str:
    h = hashlib.sha256()
    with open(path, "rb") as f:
        while chunk := f.read(1 << 20):
            h.update(chunk)
    return h.hexdigest()


@pytest.fixture
def live(tmp_path, host_core_settings):
    """A private config and state dir, installed as the host's handler (`install --no-daemon`, the handler
    borrowed: the fixture puts everything back); `cli(...)` runs the CLI on them."""
    etc, state = tmp_path / "etc", tmp_path / "state"
    etc.mkdir()
    (etc / "corehandler.toml").write_text(
        "[capture]\nmin_free = \"0\"\nmax_per_exe_per_minute = 0\n[metrics]\nenabled = false\n"
        "[journal]\nenabled = false\n[retention]\nkeep_free = \"0\"\nmax_use = \"0\"\n")
    base = CLI + ["--config-dir", str(etc), "--state-dir", str(state)]

    def cli(*argv, **kw):
        return subprocess.run(base + list(argv), capture_output=True, **kw)

    installed = cli("install", "--force", "--no-daemon", timeout=120)
    assert installed.returncode == 0, installed.stderr
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
    assert parse_settings(SETTINGS.read_text())["spool_dir"] == str(state / "spool")  # install's
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
    """The installation that owns the handler re-renders csplice.conf on reload."""
    state, etc, cli, base = live
    crasher = build_crasher(tmp_path / "bin")
    proc = serve(base)
    try:
        assert parse_settings(SETTINGS.read_text())["spool_dir"] == str(state / "spool")
        toml = etc / "corehandler.toml"
        toml.write_text(toml.read_text().replace("[capture]\n", "[capture]\nmax_dump_size = \"1M\"\n")
                        + "[compression]\nenabled = false\n")
        proc.send_signal(signal.SIGHUP)
        wait_for(lambda: "max_dump_size=1048576" in SETTINGS.read_text(), what="reload")
        crash(crasher, "segv", mib=8)
        wait_for(lambda: len(json.loads(cli("--json", "list").stdout or "[]")) == 1, what="dump indexed")
        # A broken config on SIGHUP: the daemon keeps running on the old one and says why.
        good = toml.read_text()
        toml.write_text("[compression]\nlevel = 99\n")
        proc.send_signal(signal.SIGHUP)
        wait_for(lambda: logged(proc, "Reload failed, keeping the running configuration"), what="refused reload")
        assert proc.poll() is None
        assert "max_dump_size=1048576" in SETTINGS.read_text()  # left as it was
        toml.write_text(good)
    finally:
        log = stop(proc)
    [dump] = json.loads(cli("--json", "list").stdout)
    assert dump["status"] == "truncated" and dump["path"].endswith(".core")  # 1M cap, stored raw
    assert dump["raw_bytes"] == 1 << 20 and "capture truncated: max_dump_size" in dump["problem"]
    assert "Reload failed, keeping the running configuration" in log and "compression.level" in log


def _as_user_with_cores():
    os.setgroups([])
    os.setresgid(USER, USER, USER)
    os.setresuid(USER, USER, USER)
    resource.setrlimit(resource.RLIMIT_CORE, (resource.RLIM_INFINITY, resource.RLIM_INFINITY))


def listed(cli) -> list[dict]:
    out = cli("--json", "list")
    return json.loads(out.stdout) if out.returncode == 0 and out.stdout.strip() else []


def test_a_second_daemon_never_takes_the_hosts_crashes(live, tmp_path):
    """Two daemons at once: the host's installed one (H) and `--state-dir D serve`, D never installed. Through
    D's start, its SIGHUP, its write-rate refresh and its stop, the host's csplice.conf stays byte-identical
    and the kernel's pattern ours: real crashes of root and of an ordinary user land in H's store only, and
    D's status says truthfully that D's daemon runs and does not own capture."""
    host_state, etc, cli_h, base_h = live
    d = tmp_path / "d"
    base_d = CLI + ["--config-dir", str(etc), "--state-dir", str(d)]

    def cli_d(*argv, **kw):
        return subprocess.run(base_d + list(argv), capture_output=True, **kw)

    # The user's crasher where they can run it (pytest's tmp dirs are root's, 0700).
    bin_dir = Path(tempfile.mkdtemp(prefix="cht-two-daemons-"))
    os.chmod(bin_dir, 0o755)
    crasher = build_crasher(bin_dir)
    pattern = sysctl.read(sysctl.CORE_PATTERN)
    h = serve(base_h)
    d_proc = None
    try:
        wait_for(lambda: logged(h, "Watching"), what="H watching")
        assert not logged(h, "Not the host's handler")
        conf = SETTINGS.read_bytes()
        digest = hashlib.sha256(conf).hexdigest()
        assert parse_settings(conf.decode())["owner"] == str(host_state)

        def unchanged(step: str) -> None:
            assert hashlib.sha256(SETTINGS.read_bytes()).hexdigest() == digest, f"csplice.conf changed: {step}"
            assert sysctl.read(sysctl.CORE_PATTERN) == pattern, f"core_pattern changed: {step}"
            assert handler.owner(Host()).state_dir == str(host_state), step

        # D measures its spool's write rates at start (it has none saved) and renders them: a refresh.
        assert not (d / "capture-rates.json").exists()
        d_proc = serve(base_d)
        wait_for(lambda: logged(d_proc, "Not the host's handler"), what="D saying it is not the handler")
        assert logged(d_proc, f"{host_state} captures") and logged(d_proc, f"ingesting {d / 'spool'} only")
        unchanged("D started")

        status = json.loads(cli_d("--json", "status").stdout)
        assert status["daemon"]["state"] == "running" and status["daemon"]["pid"] == d_proc.pid, status["daemon"]
        assert status["capture"]["this"] is False and status["capture"]["owner"] == str(host_state), status["capture"]
        mine = json.loads(cli_h("--json", "status").stdout)
        assert mine["capture"]["this"] is True and mine["daemon"]["pid"] == h.pid, mine

        assert crash(crasher, "segv", mib=2).returncode == -signal.SIGSEGV  # root's
        for proc in (d_proc, h):
            proc.send_signal(signal.SIGHUP)
        wait_for(lambda: logged(d_proc, "Configuration reloaded"), what="D reloaded")
        wait_for(lambda: logged(h, "Configuration reloaded"), what="H reloaded")
        unchanged("both reloaded")

        wait_for(lambda: logged(d_proc, "capture:") or logged(d_proc, "cannot measure"), timeout=120,
                 what="D's write-rate refresh")
        assert logged(d_proc, "capture:"), "".join(d_proc.lines)
        assert (d / "capture-rates.json").exists()
        unchanged("D's write-rate refresh")

        theirs = subprocess.run([str(crasher), "abort", "2"], preexec_fn=_as_user_with_cores, capture_output=True,
                                timeout=120)
        assert theirs.returncode == -signal.SIGABRT, theirs
        dumps = wait_for(lambda: (found := listed(cli_h)) and len(found) == 2 and found, timeout=60,
                         what="both crashes in H's store")
        assert sorted(dump["uid"] for dump in dumps) == [0, USER], dumps

        status = json.loads(cli_d("--json", "status").stdout)
        assert status["daemon"]["state"] == "running" and status["capture"]["this"] is False, status
        d_log = stop(d_proc)
        d_proc = None
        unchanged("D stopped")
        assert "csplice.conf" not in d_log, d_log  # D never tried to write it (no lock warnings either)
        assert json.loads(cli_d("--json", "status").stdout)["daemon"]["state"] == "stopped"
    finally:
        if d_proc is not None:
            stop(d_proc)
        stop(h)
        shutil.rmtree(bin_dir)
    assert listed(cli_d) == [] and spool_records(d) == []
    assert [dump["uid"] for dump in listed(cli_h)].count(USER) == 1
    assert hashlib.sha256(SETTINGS.read_bytes()).hexdigest() == digest

"""Symbols from a real debuginfod server (tests/support/debuginfod_server.py) for a stripped program: a crash
analysed while the server is down is unsymbolised; `corehandler analyze` with the server up fetches the debug
file (outside the analyser's sandbox, into the state dir's cache) and re-symbolises it with the same exact key;
the daemon does the same by itself for a crash it ingests while the server is up; `info` says where the
symbols came from. And a replaced library or executable gives unsymbolised frames that say why."""

from __future__ import annotations

import json
import shutil
import subprocess
import sys

import pytest

from corehandler.analysis import debuginfod, symbols, unwind
from corehandler.daemon import Settings
from corehandler.store.index import Store
from support import debuginfod_server, realcore
from support.daemon_harness import Running, wait_for

CLI = [sys.executable, "-P", "-m", "corehandler"]


@pytest.fixture(scope="module", autouse=True)
def _tools():
    for tool in ("debuginfod", "eu-stack", "gdb", "objcopy", "strip", "unshare", "ip"):
        if not shutil.which(tool):
            pytest.fail(f"{tool} is missing: scripts/install-deps test installs it (scripts/apt/*.txt)")


@pytest.fixture(scope="module")
def program(tmp_path_factory):
    return debuginfod_server.stripped_with_debug_file(tmp_path_factory.mktemp("debuginfod"))


def setup_state(tmp_path, budget="20s", analysis=""):
    state, etc = tmp_path / "state", tmp_path / "etc"
    (state / "spool").mkdir(parents=True)
    etc.mkdir()
    (etc / "corehandler.toml").write_text(f'[analysis]\ndebuginfod_urls = "{debuginfod_server.url()}"\n'
                                          f'debuginfod_budget = "{budget}"\n{analysis}[metrics]\nenabled = false\n'
                                          '[journal]\nenabled = false\n')
    return state, etc


def base(state, etc):
    return CLI + ["--config-dir", str(etc), "--state-dir", str(state)]


def top(result):
    return result["threads"][0]["frames"][0]


def test_server_down_then_up_resymbolises_with_the_same_exact_key(tmp_path, program):
    disk, served, build_id = program
    state, etc = setup_state(tmp_path)
    c = realcore.crash(disk, tmp_path / "core", "segv")
    dump_id = realcore.spool(c, state / "spool")
    settings = Settings(state, threads=1, sweep_interval=3600,
                        debuginfod=debuginfod.Settings(urls=(debuginfod_server.url(),), budget=5))
    with Running(settings):
        wait_for(lambda: not (state / "spool" / f"{dump_id}.json").exists(), what="ingested")
    with Store(state) as store:
        before = store.analysis_for(dump_id)
    assert top(before)["function"] is None and top(before)["build_id"] == build_id
    exe = next(m for m in before["modules"] if m["build_id"] == build_id)
    assert exe["symbols"] == symbols.NONE
    assert not debuginfod.cached(debuginfod.cache_dir(state), build_id).exists()  # down: nothing, no negative

    (analyze, info) = debuginfod_server.in_netns(served, build_id, [
        base(state, etc) + ["--json", "analyze", f"id={dump_id}"], base(state, etc) + ["info", f"id={dump_id}"]])
    assert analyze["rc"] == 0, analyze["stderr"]
    (done,) = json.loads(analyze["stdout"])
    assert done["debuginfod"]["fetched"] == [build_id] and done["core"] == "mini"
    assert done["exact_key_unchanged"] and done["exact_key"] == before["exact_key"]
    assert "crash_segv" in done["signature"] and "crash_segv" not in before["signature"]
    with Store(state) as store:
        after = store.analysis_for(dump_id)
    assert top(after)["function"] == "crash_segv" and after["exact_key"] == before["exact_key"]
    assert info["rc"] == 0 and "crash_segv (analysed + 0x" in info["stdout"]
    assert f"{disk} build-id {build_id}, symbols: debuginfod" in info["stdout"]
    assert "Analysed From: the mini core" in info["stdout"]


def test_the_daemon_fetches_beside_ingest_and_resymbolises(tmp_path, program):
    disk, served, build_id = program
    state, etc = setup_state(tmp_path)
    c = realcore.crash(disk, tmp_path / "core", "thread")
    dump_id = realcore.spool(c, state / "spool")
    run = serve_until(served, build_id, state, etc, "worker_crash")
    with Store(state) as store:
        result = store.analysis_for(dump_id)
    assert top(result)["function"] == "worker_crash", run["stdout"]
    assert result["core"] == "mini" and "Re-symbolised" in run["stdout"]
    assert debuginfod.cached(debuginfod.cache_dir(state), build_id).exists()


# `serve` in the server's namespace until the crashing thread's trace names the function, then its log
_SERVE_UNTIL = ("import json, subprocess, sys, time\n"
                "function, base, serve = sys.argv[1], sys.argv[2:-1], json.loads(sys.argv[-1])\n"
                "daemon = subprocess.Popen(base + serve, stdout=subprocess.DEVNULL, stderr=subprocess.PIPE)\n"
                "deadline = time.monotonic() + 120\n"
                "while time.monotonic() < deadline:\n"
                "    p = subprocess.run(base + ['--json', 'info', '--no-verify'], capture_output=True)\n"
                "    a = json.loads(p.stdout or '[{}]')[0].get('analysis') or {}\n"
                "    if any(f.get('function') == function for t in a.get('threads', [])[:1] for f in t['frames']):\n"
                "        break\n"
                "    time.sleep(0.3)\n"
                "daemon.terminate()\n"
                "print(daemon.communicate(timeout=30)[1].decode()[-3000:])\n")


def serve_until(served, build_id, state, etc, function, *serve_args) -> dict:
    (run,) = debuginfod_server.in_netns(served, build_id, [[sys.executable, "-P", "-c", _SERVE_UNTIL, function]
                                                          + base(state, etc) + [json.dumps(["serve", *serve_args])]])
    return run


def schedule(state) -> list[tuple]:
    with Store(state) as store:
        return store.db.execute("SELECT id, tries, due FROM resymbolise").fetchall()


def test_the_daemon_tries_again_on_its_schedule_once_the_server_is_up(tmp_path, program):
    """Ingested while the server is down: the dump waits on the schedule; the daemon started later beside the
    server fetches when it is due, re-symbolises from the mini core, keeps the exact key and ends the schedule."""
    disk, served, build_id = program
    state, etc = setup_state(tmp_path, analysis='resymbolise_after = ["2s", "2s", "1d"]\n')
    c = realcore.crash(disk, tmp_path / "core", "segv")
    dump_id = realcore.spool(c, state / "spool")
    settings = Settings(state, threads=1, sweep_interval=3600,
                        debuginfod=debuginfod.Settings(urls=(debuginfod_server.url(),), budget=5,
                                                       retry_after=(2.0, 2.0, 86400.0)))
    with Running(settings):
        wait_for(lambda: not (state / "spool" / f"{dump_id}.json").exists(), what="ingested")
    with Store(state) as store:
        before = store.analysis_for(dump_id)
    assert top(before)["function"] is None
    ((row_id, tries, _),) = schedule(state)
    assert row_id == dump_id and tries < 2  # (a slow host may have made its first try, with the server down)

    run = serve_until(served, build_id, state, etc, "crash_segv", "--sweep-interval", "0.5")
    with Store(state) as store:
        after = store.analysis_for(dump_id)
    assert top(after)["function"] == "crash_segv", run["stdout"]
    assert "Re-symbolised" in run["stdout"] and after["core"] == "mini"
    assert after["exact_key"] == before["exact_key"] and after["exact_version"] == before["exact_version"]
    assert after["signature"] != before["signature"] and "crash_segv" in after["signature"]
    assert after["signature_version"] == before["signature_version"]
    assert schedule(state) == []  # nothing lacking: no more tries
    info = subprocess.run(base(state, etc) + ["info", f"id={dump_id}"], capture_output=True, text=True)
    assert "Re-symbolised: " in info.stdout and "Analysed From: the mini core" in info.stdout, info.stderr


@pytest.mark.root
def test_a_dbgsym_package_installed_after_the_crash_symbolises_it_on_schedule(tmp_path, program):
    """No debuginfod at all: the debug file appears in /usr/lib/debug/.build-id (as a -dbgsym package puts it)
    after ingest, and the next due try finds it."""
    disk, served, build_id = program
    state, _ = setup_state(tmp_path)
    c = realcore.crash(disk, tmp_path / "core", "segv")
    dump_id = realcore.spool(c, state / "spool")
    installed = debuginfod.system_debug_file(build_id)
    assert not installed.exists()
    made = [d for d in (installed.parent, installed.parent.parent, installed.parent.parent.parent) if not d.exists()]
    settings = Settings(state, threads=1, sweep_interval=0.2, debuginfod=debuginfod.Settings(retry_after=(1.0, 1.0)))
    try:
        with Running(settings):
            wait_for(lambda: not (state / "spool" / f"{dump_id}.json").exists(), what="ingested")
            with Store(state) as store:
                assert top(store.analysis_for(dump_id))["function"] is None
            installed.parent.mkdir(parents=True, exist_ok=True)
            shutil.copyfile(served / "analysed.debug", installed)

            def named():
                with Store(state) as store:
                    return top(store.analysis_for(dump_id))["function"]
            assert wait_for(named, what="re-symbolised") == "crash_segv"
        with Store(state) as store:
            exe = next(m for m in store.analysis_for(dump_id)["modules"] if m["build_id"] == build_id)
        assert exe["symbols"] == symbols.LOCAL and schedule(state) == []
    finally:
        installed.unlink(missing_ok=True)
        for d in made:
            d.rmdir()


def test_the_schedule_stops_after_its_last_try(tmp_path, program, caplog):
    """A server that stays down: asked at ingest and at each of the schedule's tries, then never again (the
    dump's row goes; `corehandler analyze` is left)."""
    disk, _, build_id = program
    state, _ = setup_state(tmp_path)
    c = realcore.crash(disk, tmp_path / "core", "segv")
    dump_id = realcore.spool(c, state / "spool")
    settings = Settings(state, threads=1, sweep_interval=0.2,
                        debuginfod=debuginfod.Settings(urls=(debuginfod_server.url(),), budget=5,
                                                       retry_after=(0.5, 0.5)))

    def asked():
        return [r for r in caplog.records if r.getMessage().startswith(f"debuginfod: {build_id}: ")]
    with caplog.at_level("WARNING", logger="corehandler.analysis.debuginfod"), Running(settings):
        wait_for(lambda: len(asked()) >= 3, what="asked at ingest and twice on schedule")
        assert schedule(state) == []
    assert len(asked()) == 3
    with Store(state) as store:
        assert top(store.analysis_for(dump_id))["function"] is None


def test_a_replaced_library_is_unsymbolised_and_says_so(tmp_path):
    """A shared library rebuilt after the crash (another build-id on disk): its frames are unsymbolised, never
    named from the other build, its module says `none (build-id mismatch)` and the analysis says why."""
    (tmp_path / "lib.c").write_text("#ifdef PAD\nint pad(int x) { return x * 7; }\n#endif\n"
                                    "__attribute__((noinline)) void lib_crash(void) { *(volatile int *) 0 = 1; }\n")
    (tmp_path / "main.c").write_text("void lib_crash(void);\nint main(void) { lib_crash(); return 0; }\n")
    lib, prog = tmp_path / "libcrashy.so", tmp_path / "prog"
    subprocess.run(["gcc", "-g", "-O1", "-shared", "-fPIC", "-o", str(lib), str(tmp_path / "lib.c")], check=True)
    subprocess.run(["gcc", "-g", "-O1", "-o", str(prog), str(tmp_path / "main.c"), f"-L{tmp_path}", "-lcrashy",
                    f"-Wl,-rpath,{tmp_path}"], check=True)
    c = realcore.crash(prog, tmp_path / "core")
    record = realcore.record_for(c, "id")
    first = unwind.analyse(c.core, record)
    assert top(first)["function"] == "lib_crash"
    subprocess.run(["gcc", "-g", "-O1", "-DPAD", "-shared", "-fPIC", "-o", str(lib), str(tmp_path / "lib.c")],
                   check=True)
    result = unwind.analyse(c.core, record)
    symbols.annotate(result, tmp_path / "state")
    assert top(result)["function"] is None and top(result)["build_id"] == top(first)["build_id"]
    module = next(m for m in result["modules"] if m["name"] == str(lib))
    assert module["symbols"] == symbols.MISMATCH
    assert any(p.startswith(f"{lib} on disk is not the build that crashed") for p in result["problems"])
    # (past it the unwind may stop too: its unwind tables went with the file; that is what the problem says)

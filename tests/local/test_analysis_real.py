"""Analysis of real crashes of programs built here (tests/support/analysed.c), cored by gdb's gcore, through
the real eu-stack: the crashing function and thread, the keys, and the bad inputs of issue 11."""

from __future__ import annotations

import os
import shutil
import subprocess
import sys
import threading
import time
from pathlib import Path

import pytest

from corehandler.analysis import findings, unwind
from support import realcore


@pytest.fixture(scope="module", autouse=True)
def _tools():
    for tool in ("gdb", "eu-stack", "eu-unstrip", "gcc"):
        if not shutil.which(tool):
            pytest.fail(f"{tool} is missing: scripts/install-deps installs it (scripts/apt/*.txt)")


@pytest.fixture(scope="module")
def cache(tmp_path_factory):
    return tmp_path_factory.mktemp("analysed-bin")


@pytest.fixture(scope="module")
def binary(cache):
    return realcore.build(cache, name="analysed")


def analyse(tmp_path, binary, *args, limits=findings.Limits(), **proc):
    c = realcore.crash(binary, tmp_path / f"core.{'-'.join(args)}", *args)
    return c, unwind.analyse(c.core, realcore.record_for(c, "id", **proc), limits)


def top(result):
    return result["threads"][0]["frames"][0]


def test_segv_names_the_function_file_and_line(tmp_path, binary):
    c, r = analyse(tmp_path, binary, "segv", limits=findings.Limits(source_lines=True))
    assert r["state"] == findings.OK, r["problems"]
    assert r["crashing_tid"] == c.tid and r["threads"][0]["crashing"]
    f = top(r)
    assert f["function"] == "crash_segv" and f["file"].endswith("analysed.c") and f["line"]
    assert f["build_id"] == r["exe"]["build_id"] == r["exe"]["disk_build_id"] and r["exe"]["state"] == "same"
    assert r["signature"].startswith("analysed SIGSEGV crash_segv < main")
    _, plain = analyse(tmp_path, binary, "segv")
    assert top(plain)["function"] == "crash_segv" and top(plain)["file"] is None


def test_modules_and_build_ids_as_eu_unstrip_lists_them(tmp_path, binary):
    c, r = analyse(tmp_path, binary, "thread")
    listed = subprocess.run(["eu-unstrip", "-n", f"--core={c.core}"], capture_output=True, text=True).stdout
    # eu-unstrip: START+SIZE BUILDID@ADDR FILE DEBUGFILE NAME; the vDSO is no file, so not ours
    theirs = {line.split()[1].split("@")[0] for line in listed.splitlines() if "vdso" not in line}
    ours = {m["build_id"] for m in r["modules"]}
    assert ours == theirs and len(ours) >= 3
    exe = next(m for m in r["modules"] if m["name"] == str(binary))
    assert exe["build_id"] == r["exe"]["build_id"] and exe["start"] <= top(r)["pc"] < exe["start"] + exe["size"]


def test_thread_crashing_among_eight(tmp_path, binary):
    c, r = analyse(tmp_path, binary, "thread")
    assert c.tid != c.pid
    assert r["crashing_tid"] == c.tid and r["threads"][0]["tid"] == c.tid
    assert r["threads_seen"] == 9 and len(r["threads"]) == 9
    assert top(r)["function"] == "worker_crash"
    assert [t["crashing"] for t in r["threads"]].count(True) == 1
    assert r["signature"].startswith("analysed SIGSEGV worker_crash < worker")


def test_deep_recursion_is_cut_and_collapsed(tmp_path, binary):
    _, r = analyse(tmp_path, binary, "recurse", limits=findings.Limits(frames=32))
    t = r["threads"][0]
    assert len(t["frames"]) == 32 and t["frames_cut"]
    assert r["state"] == findings.PARTIAL and any("frames" in x for x in r["cut"])
    assert r["signature"] == "analysed SIGSEGV recurse"


def test_assert_drops_the_abort_frames(tmp_path, binary):
    _, r = analyse(tmp_path, binary, "assert")
    functions = [f["function"] for f in r["threads"][0]["frames"]]
    assert "abort" in functions and "do_assert" in functions
    assert r["signature"].startswith("analysed SIGABRT do_assert < main")


# What glibc 2.36+ picks for strlen on this CPU, and with its AVX-512 and AVX2 use turned off by tunables.
_VARIANTS = {"": None, "glibc.cpu.hwcaps=-AVX512VL,-AVX512BW": None,
             "glibc.cpu.hwcaps=-AVX512VL,-AVX512BW,-AVX2": "__strlen_sse2"}


def test_strlen_null_one_v2_signature_whichever_variant_libc_picked(tmp_path, binary):
    """The same strlen(NULL) crash, with libc made to pick another ifunc variant each time: one v2 signature
    (`strlen | count_name`), as many v1 signatures as variants, each naming it."""
    results = {}
    for tunables, expected in _VARIANTS.items():
        c = realcore.crash(binary, tmp_path / f"core.{len(results)}", "strlen", env={"GLIBC_TUNABLES": tunables})
        r = unwind.analyse(c.core, realcore.record_for(c, "id"))
        variant = top(r)["function"]
        assert variant.startswith("__strlen_") and (expected is None or variant == expected), variant
        results[variant] = r
    if len(results) < 2:
        pytest.skip(f"this CPU gives only {list(results)}: the variants cannot be told apart here")
    assert {r["signature"] for r in results.values()} == {"analysed SIGSEGV strlen | count_name < main"}
    assert len({r["signature_id"] for r in results.values()}) == 1
    assert len({r["signature_v1_id"] for r in results.values()}) == len(results)


def test_cxx_throw(tmp_path, cache):
    if not shutil.which("g++"):
        pytest.skip("g++ is not installed (scripts/apt/test.txt has it)")
    b = realcore.build(cache, cxx=True, name="analysed-cxx")
    _, r = analyse(tmp_path, b)
    assert r["signature"].startswith("analysed-cxx SIGABRT app::thrower < main"), r["signature"]


def test_stripped_pie(tmp_path, cache):
    b = realcore.build(cache, "-fPIE", "-pie", strip=True, name="analysed-stripped")
    _, r = analyse(tmp_path, b, "segv")
    f = top(r)
    assert f["function"] is None and f["build_id"] == r["exe"]["build_id"] and f["offset"] is not None
    assert r["signature"] == "analysed-stripped SIGSEGV analysed-stripped"
    assert r["exact_key"]


def test_two_builds_of_a_stripped_program_share_a_signature(tmp_path, cache):
    one = realcore.build(cache / "stripped-1", "-fPIE", "-pie", strip=True, name="stripped-app")
    two = realcore.build(cache / "stripped-2", "-fPIE", "-pie", "-DPAD", strip=True, name="stripped-app")
    _, a = analyse(tmp_path, one, "segv")
    _, b = analyse(tmp_path, two, "segv")
    assert top(a)["offset"] != top(b)["offset"] and a["exe"]["build_id"] != b["exe"]["build_id"]
    assert a["signature_id"] == b["signature_id"] and a["exact_key"] != b["exact_key"]
    assert a["signature_v1_id"] != b["signature_v1_id"]


def test_same_crash_twice_same_keys_other_site_other_keys(tmp_path, binary):
    _, a = analyse(tmp_path, binary, "segv")
    _, b = analyse(tmp_path, binary, "segv")
    _, other = analyse(tmp_path, binary, "other")
    assert (a["signature_id"], a["exact_key"]) == (b["signature_id"], b["exact_key"])
    assert other["signature_id"] != a["signature_id"] and other["exact_key"] != a["exact_key"]


def test_rebuilt_binary_same_signature_other_exact_key(tmp_path, cache, binary):
    (cache / "pad").mkdir(exist_ok=True)
    rebuilt = realcore.build(cache / "pad", "-DPAD", name="analysed")
    _, old = analyse(tmp_path, binary, "segv")
    _, new = analyse(tmp_path, rebuilt, "segv")
    assert old["exe"]["build_id"] != new["exe"]["build_id"]
    assert top(old)["offset"] != top(new)["offset"]
    assert old["signature"] == new["signature"] and old["signature_id"] == new["signature_id"]
    assert old["exact_key"] != new["exact_key"]


def test_replaced_and_deleted_exe(tmp_path, cache):
    here = tmp_path / "bin"
    b = realcore.build(here, name="analysed")
    c = realcore.crash(b, tmp_path / "core", "segv")
    os.replace(realcore.build(cache / "replacement", "-DPAD", name="analysed"), b)
    r = unwind.analyse(c.core, realcore.record_for(c, "id"))
    assert r["exe"]["state"] == "replaced" and r["exe"]["disk_build_id"] != r["exe"]["build_id"]
    assert any("replaced" in p for p in r["problems"]) and r["state"] == findings.PARTIAL
    assert top(r)["function"] is None  # not symbolised from the wrong file
    b.unlink()
    r = unwind.analyse(c.core, realcore.record_for(c, "id"))
    assert r["exe"]["state"] == "unreadable"  # gone since, as a file the user may not read would be
    r = unwind.analyse(c.core, dict(realcore.record_for(c, "id"), proc={"exe": f"{b} (deleted)"}))
    assert r["exe"]["state"] == "deleted" and top(r)["offset"] is not None


def test_truncated_core(tmp_path, binary):
    c = realcore.crash(binary, tmp_path / "core", "thread")
    size = c.core.stat().st_size
    for keep in (size // 2, 4096, 100):
        cut = tmp_path / f"core.{keep}"
        with open(c.core, "rb") as src, open(cut, "wb") as dst:
            dst.write(src.read(keep))
        r = unwind.analyse(cut, realcore.record_for(c, "id"))
        assert r["state"] in (findings.OK, findings.PARTIAL, findings.FAILED)
        assert r["seconds"] < findings.Limits().timeout


def test_thousands_of_threads_are_bounded(tmp_path, binary):
    c, r = analyse(tmp_path, binary, "threads", "1500", limits=findings.Limits(threads=64))
    assert len(r["threads"]) == 64 and r["threads_seen"] == 1501
    assert r["threads"][0]["tid"] == c.tid and top(r)["function"] == "crash_segv"
    assert any("threads: 64 of 1501" in x for x in r["cut"])


def test_output_over_the_cap_keeps_what_came_first(tmp_path, binary):
    _, r = analyse(tmp_path, binary, "thread", limits=findings.Limits(output_bytes=3000))
    assert r["state"] == findings.PARTIAL and any("SIGXFSZ" in p for p in r["problems"])
    assert top(r)["function"] == "worker_crash"


def test_package_note(tmp_path, cache):
    meta = '{"type":"deb","name":"analysed","version":"1.2-3","architecture":"amd64"}'
    b = realcore.build(cache, "-Xlinker", f"--package-metadata={meta}", name="analysed-packaged")
    _, r = analyse(tmp_path, b, "segv")
    assert r["exe"]["package"] == {"type": "deb", "name": "analysed", "version": "1.2-3", "architecture": "amd64"}
    assert r["packages"][str(b)]["version"] == "1.2-3"


def test_python_interpreter_crash(tmp_path):
    core = tmp_path / "core"
    c = realcore.crash(Path(sys.executable).resolve(), core, "-c", "import os, signal; os.kill(os.getpid(), 11)")
    r = unwind.analyse(core, realcore.record_for(c, "id"))
    assert r["state"] in (findings.OK, findings.PARTIAL) and r["threads"][0]["frames"]
    assert r["signature"].split()[1] == "SIGSEGV"


# -- the child's limits, by fault injection: a fake eu-stack ------------------------------------------------

@pytest.fixture
def fake_stack(tmp_path, monkeypatch):
    def install(script: str):
        path = tmp_path / "fake-eu-stack"
        path.write_text("#!/bin/sh\n" + script)
        path.chmod(0o755)
        real = unwind._tool
        monkeypatch.setattr(unwind, "_tool", lambda name: str(path) if name == "eu-stack" else real(name))
        return path
    return install


def test_hanging_analyser_is_killed_at_the_timeout(tmp_path, binary, fake_stack):
    c = realcore.crash(binary, tmp_path / "core", "segv")
    fake_stack("echo 'TID 1:'\nsleep 600 & sleep 600\n")
    started = time.monotonic()
    r = unwind.analyse(c.core, realcore.record_for(c, "id"), findings.Limits(timeout=1))
    assert time.monotonic() - started < 20
    assert r["state"] == findings.TIMEOUT and "timeout" in r["problems"][0]
    assert r["modules"]  # eu-unstrip finished and is kept
    assert not subprocess.run(["pgrep", "-f", str(tmp_path / "fake-eu-stack")]).returncode == 0


def test_crashing_analyser(tmp_path, binary, fake_stack):
    c = realcore.crash(binary, tmp_path / "core", "segv")
    fake_stack("kill -SEGV $$\n")
    r = unwind.analyse(c.core, realcore.record_for(c, "id"))
    assert r["state"] == findings.FAILED and any("killed by SIGSEGV" in p for p in r["problems"])


def test_missing_analyser(tmp_path, monkeypatch):
    monkeypatch.setattr(unwind, "_tool", lambda name: None)
    r = unwind.analyse(tmp_path / "nothing", {"tid": 1})
    assert r["state"] == findings.UNAVAILABLE and "elfutils" in r["problems"][0]


def test_the_child_has_no_core_no_network_no_proxies_and_low_priority(tmp_path, binary, fake_stack, monkeypatch):
    c = realcore.crash(binary, tmp_path / "core", "segv")
    monkeypatch.setenv("http_proxy", "http://proxy.invalid:3128")
    monkeypatch.setenv("DEBUGINFOD_URLS", "http://debuginfod.invalid")
    fake_stack('echo "TID 1:"\n'
               'echo "#0  0x0000000000000001 core=$(awk /core.file/{print\\ \\$5} /proc/self/limits),'
               'as=$(ulimit -v),nice=$(nice),'
               'net=$(awk -F: "NR>2 {gsub(/ /, \\"\\", \\$1); printf \\"%s+\\", \\$1}" /proc/self/net/dev),'
               'env=$(env | grep -ci -e proxy -e debuginfod) - x"\n')
    r = unwind.analyse(c.core, realcore.record_for(c, "id"), findings.Limits(memory_bytes=1 << 30))
    facts = dict(kv.split("=", 1) for kv in top(r)["function"].split(","))
    assert facts["core"] == "1" and facts["as"] == str((1 << 30) // 1024) and facts["nice"] == "19"
    assert facts["env"] == "0" and {"limits", "nice", "ionice"} <= set(r["sandbox"])
    if os.geteuid() == 0:
        assert facts["net"] == "lo+"  # a network namespace of its own: loopback only


# -- the crash's reason (analysis/reason.py): NT_SIGINFO, the stack pointer, glibc's __abort_msg -------------

@pytest.mark.parametrize("how, expected", [
    ("segv", r"null pointer dereference \(SEGV_MAPERR at 0x0\)"),
    ("strlen", r"null pointer dereference \(SEGV_MAPERR at 0x0\)"),
    ("assert", r"assertion failed: x == 42 \(\S*analysed\.c:\d+, do_assert\)"),
    ("doublefree", r"abort: free\(\): double free detected in tcache 2"),
    ("overflow", r"stack overflow \(SEGV_(MAPERR|ACCERR) at 0x[0-9a-f]+, stack pointer 0x[0-9a-f]+\)"),
])
def test_the_reason_of_real_crashes(tmp_path, binary, how, expected):
    import re
    _, r = analyse(tmp_path, binary, how)
    why = r["reason"]
    assert re.fullmatch(expected, why["text"]), why
    if how in ("assert", "doublefree"):
        assert why["signal"] == 6 and why["code"] == "SI_TKILL" and why["abort_message"]
    else:
        assert why["signal"] == 11 and why["addr"] is not None


def test_an_analyser_started_by_a_thread_stepping_aside_for_a_capture_does_not_stay_sched_idle(
        tmp_path, binary, fake_stack):
    """idlecpus.StepAside makes every thread of the daemon SCHED_IDLE while a capture runs; a child forked then
    would keep it for its life, and wait for a CPU through its whole time budget on a busy host."""
    c = realcore.crash(binary, tmp_path / "core", "segv")
    fake_stack('echo "TID 1:"\n'
               'echo "#0  0x0000000000000001 policy=$(cut -d" " -f41 /proc/self/stat) - x"\n')
    got = {}

    def idle_thread():
        os.sched_setscheduler(0, os.SCHED_IDLE, os.sched_param(0))
        got["r"] = unwind.analyse(c.core, realcore.record_for(c, "id"))

    t = threading.Thread(target=idle_thread)
    t.start()
    t.join(60)
    r = got["r"]
    assert top(r)["function"] == f"policy={os.SCHED_OTHER}", r
    assert "not-idle" in r["sandbox"]

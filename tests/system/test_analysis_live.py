"""Analysis on the live kernel: real crashes through core_pattern into csplice, `corehandler serve` analysing
them beside compression, and `info`/`list --group` showing the trace and the signature; a crash inside a PID
namespace (unshare --pid --fork --mount-proc) shows its namespace PID."""

from __future__ import annotations

import json
import os
import resource
import subprocess

import pytest
from test_daemon_live import live, serve, stop  # noqa: F401 (live is a fixture)

from support import realcore, unwound
from support.daemon_harness import wait_for

pytestmark = [pytest.mark.root, pytest.mark.live_kernel]


def _allow_core():
    resource.setrlimit(resource.RLIMIT_CORE, (resource.RLIM_INFINITY, resource.RLIM_INFINITY))


def indexed(cli, count):
    def done():
        out = cli("--json", "list")
        return out.returncode == 0 and len(json.loads(out.stdout)) == count and \
            all(d["analysis_state"] not in (None, "pending") for d in json.loads(out.stdout))
    wait_for(done, what=f"{count} dumps indexed and analysed", timeout=120)
    return json.loads(cli("--json", "list").stdout)


def test_real_crashes_are_analysed_grouped_and_shown(live, tmp_path):
    state, etc, cli, base = live
    binary = realcore.build(tmp_path / "bin", name="analysed")
    daemon = serve(base)
    try:
        for kind in ("thread", "thread", "segv"):
            r = subprocess.run([str(binary), kind], preexec_fn=_allow_core, capture_output=True, timeout=60)
            assert r.returncode == -11
        dumps = indexed(cli, 3)
    finally:
        log = stop(daemon)
    assert "Traceback" not in log
    assert all(d["analysis_state"] == "ok" for d in dumps), dumps
    first = dumps[0]
    info = cli("info", f"id={first['id']}", text=True).stdout
    assert "worker_crash (analysed + 0x" in info and "Signature: analysed SIGSEGV worker_crash < worker" in info
    detail = json.loads(cli("--json", "info", f"id={first['id']}").stdout)[0]["analysis"]
    crashing = detail["threads"][0]
    # the kernel's %i is the crashing thread, and its notes come first
    assert crashing["crashing"] and crashing["tid"] == detail["crashing_tid"] != first["pid"]
    assert detail["threads_seen"] == 9 and detail["exe"]["state"] == "same"
    groups = json.loads(cli("--json", "list", "--group").stdout)
    assert sorted(g["count"] for g in groups) == [1, 2]
    two = next(g for g in groups if g["count"] == 2)
    assert two["exact_keys"] == 1 and "worker_crash" in two["signature"]


def test_crash_in_a_pid_namespace_shows_the_namespace_pid(live, tmp_path):
    state, etc, cli, base = live
    binary = realcore.build(tmp_path / "bin", name="analysed")
    daemon = serve(base)
    try:
        # The shell is PID 1 of the new namespace (the trailing `true` keeps it from exec'ing the crasher),
        # so the crasher is PID 2 there.
        subprocess.run(["unshare", "--pid", "--fork", "--mount-proc", "sh", "-c", f"{binary} segv; true"],
                       preexec_fn=_allow_core, capture_output=True, timeout=60)
        (dump,) = indexed(cli, 1)
    finally:
        stop(daemon)
    detail = json.loads(cli("--json", "info", f"id={dump['id']}").stdout)[0]["analysis"]
    ident = detail["identity"]
    assert len(ident["nspid"]) == 2 and ident["nspid"][0] == dump["pid"] and ident["pid_in_namespace"] == 2
    own = os.stat("/proc/self/ns/pid").st_ino
    assert ident["namespaces"]["pid"] != own and ident["namespaces"]["mnt"]
    assert "NSpid: " in cli("info", f"id={dump['id']}", text=True).stdout
    assert detail["threads"][0]["frames"][0]["function"] == "crash_segv"


def test_mini_cores_of_kernel_cores_unwind_like_the_full_ones(live, tmp_path):
    """The kernel's own cores (8 threads; 5000 frames deep): eu-stack and gdb unwind the mini core the daemon
    wrote at ingest to the same frames as the full core `corehandler dump` gives back (a stack deeper than
    the mini's per-thread cap: its first frames)."""
    state, etc, cli, base = live
    binary = realcore.build(tmp_path / "bin", name="analysed")
    daemon = serve(base)
    try:
        for kind in ("thread", "recurse"):
            r = subprocess.run([str(binary), kind], preexec_fn=_allow_core, capture_output=True, timeout=60)
            assert r.returncode == -11
        dumps = indexed(cli, 2)
    finally:
        stop(daemon)
    for dump, deep in zip(dumps, (False, True)):
        full = tmp_path / f"{dump['id']}.core"
        assert cli("dump", f"id={dump['id']}", "-o", str(full)).returncode == 0
        mini = state / "store" / dump["mini_path"]
        assert 0 < dump["mini_bytes"] == mini.stat().st_size < full.stat().st_size
        f, m = unwound.eu_stack(full), unwound.eu_stack(mini)
        assert list(m) == list(f) and len(f) == (9 if not deep else 1)
        for frames_f, frames_m in zip(f.values(), m.values()):
            assert frames_m == frames_f if not deep else (len(frames_m) > 1000 and frames_m == frames_f[:len(frames_m)])
        g_full, g_mini = unwound.gdb_bt(binary, full), unwound.gdb_bt(binary, mini)
        assert [t for t, _ in g_mini] == [t for t, _ in g_full]
        for (_, frames_f), (_, frames_m) in zip(g_full, g_mini):
            assert frames_m == frames_f if not deep else (len(frames_m) > 1000 and frames_m == frames_f[:len(frames_m)])


def _no_core():
    resource.setrlimit(resource.RLIMIT_CORE, (0, resource.RLIM_INFINITY))


def test_signature_v2_reasons_and_a_missing_core_on_the_live_kernel(live, tmp_path):
    """Issue 36 through the real handler: strlen(NULL) with libc's evex, avx2 and sse2 variants (forced by
    GLIBC_TUNABLES) has one v2 signature; a NULL write, an assert, a double free and a stack overflow say so
    in `info`; a crash under `ulimit -c 0` says why it has no core."""
    state, etc, cli, base = live
    binary = realcore.build(tmp_path / "bin", name="analysed")
    tunables = ("", "glibc.cpu.hwcaps=-AVX512VL,-AVX512BW", "glibc.cpu.hwcaps=-AVX512VL,-AVX512BW,-AVX2")
    daemon = serve(base)
    try:
        for t in tunables:
            subprocess.run([str(binary), "strlen"], preexec_fn=_allow_core, capture_output=True, timeout=60,
                           env=dict(os.environ, GLIBC_TUNABLES=t))
        for kind in ("segv", "assert", "doublefree", "overflow"):
            subprocess.run([str(binary), kind], preexec_fn=_allow_core, capture_output=True, timeout=60)
        subprocess.run([str(binary), "other"], preexec_fn=_no_core, capture_output=True, timeout=60)
        dumps = indexed(cli, 8)
    finally:
        log = stop(daemon)
    assert "Traceback" not in log
    details = [json.loads(cli("--json", "info", f"id={d['id']}").stdout)[0] for d in dumps]
    strlens = [d["analysis"] for d in details[:3]]
    assert len({a["threads"][0]["frames"][0]["function"] for a in strlens}) >= 2  # the variants differed
    assert {a["signature"] for a in strlens} == {"analysed SIGSEGV strlen | count_name < main"}
    assert [a["reason"]["text"] for a in strlens] == ["null pointer dereference (SEGV_MAPERR at 0x0)"] * 3
    reasons = [d["analysis"]["reason"]["text"] for d in details[3:7]]
    assert reasons[0] == "null pointer dereference (SEGV_MAPERR at 0x0)"
    assert reasons[1].startswith("assertion failed: x == 42 (") and reasons[1].endswith(", do_assert)")
    assert reasons[2] == "abort: free(): double free detected in tcache 2"
    assert reasons[3].startswith("stack overflow (")
    assert "Reason: assertion failed: x == 42" in cli("info", f"id={dumps[4]['id']}", text=True).stdout
    missing = details[7]
    assert missing["status"] == "dropped" and missing["no_core"]["reason"] == "rlimit_core"
    assert "RLIMIT_CORE was 0" in cli("info", f"id={dumps[7]['id']}", text=True).stdout
    assert "no core: rlimit_core" in cli("list", text=True).stdout

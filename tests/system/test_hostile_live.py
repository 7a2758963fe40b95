"""Hostile input on the live kernel: a binary that carries a crafted .note.package crashes through
core_pattern into csplice, and `corehandler serve` ingests it like any other (issue 20, item 2: a note of
2000 `[` made the package parser raise RecursionError, and the daemon retried that record forever)."""

from __future__ import annotations

import json
import subprocess

import pytest
from test_analysis_live import _allow_core, indexed
from test_daemon_live import live, serve, stop  # noqa: F401 (live is a fixture)

pytestmark = [pytest.mark.root, pytest.mark.live_kernel]

PACKAGE_NOTE_TYPE = 0xCAFE1A7E


def build_with_package_note(directory, name: str, desc: bytes):
    """A program that dies of SIGSEGV and carries desc as its .note.package (owner FDO), in a PT_NOTE
    segment as the linker lays out every allocated note: the kernel dumps it with the first page."""
    body = ",".join(str(b) for b in desc + b"\0")
    source = directory / f"{name}.c"
    source.write_text(f'''#include <signal.h>
__asm__(".pushsection .note.package,\\"a\\",@note\\n"
        ".balign 4\\n"
        ".long 4\\n"
        ".long 2f - 1f\\n"
        ".long {PACKAGE_NOTE_TYPE:#x}\\n"
        ".asciz \\"FDO\\"\\n"
        "1: .byte {body}\\n"
        "2: .balign 4\\n"
        ".popsection\\n");
int main(void) {{ raise(SIGSEGV); return 0; }}
''')
    binary = directory / name
    subprocess.run(["gcc", "-O1", "-g", "-o", str(binary), str(source)], check=True)
    notes = subprocess.run(["readelf", "-n", str(binary)], capture_output=True, text=True, check=True).stdout
    assert "FDO_PACKAGING_METADATA" in notes
    return binary


def test_a_crafted_package_note_is_a_problem_of_its_dump_not_a_stopped_ingest(live, tmp_path):
    state, etc, cli, base = live
    good = build_with_package_note(tmp_path, "withnote", b'{"type":"deb","name":"hostile-test","version":"1"}')
    deep = build_with_package_note(tmp_path, "deepnote", b"[" * 2000)
    daemon = serve(base)
    try:
        for binary in (deep, good, deep):
            assert subprocess.run([str(binary)], preexec_fn=_allow_core, timeout=60).returncode == -11
        dumps = indexed(cli, 3)
    finally:
        log = stop(daemon)
    assert "Traceback" not in log and "retrying later" not in log and "given up" not in log
    by_exe = {}
    for d in dumps:
        by_exe.setdefault(d["exe"], []).append(d)
    assert len(by_exe[str(deep)]) == 2 and len(by_exe[str(good)]) == 1
    for d in dumps:
        assert d["status"] == "ok"
        analysis = json_info(cli, d["id"])["analysis"]
        assert analysis["state"] in ("ok", "partial") and analysis["threads"][0]["frames"], analysis
        if d["exe"] == str(good):  # the control: package notes are read from a live core
            assert analysis["packages"][str(good)] == {"type": "deb", "name": "hostile-test", "version": "1"}
        else:
            assert analysis["packages"] == {} and analysis["exe"]["package"] is None


def json_info(cli, dump_id: str) -> dict:
    out = cli("--json", "info", f"id={dump_id}")
    assert out.returncode == 0, out.stderr
    return json.loads(out.stdout)[0]

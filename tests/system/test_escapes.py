"""Terminal escapes from a crash reach no terminal (issue 20, item 8): a real crash of a program whose path,
name and package note carry OSC, CSI, BEL, C1 controls and bidi overrides goes through the real daemon (the
real analyser) and up to a real S3 server; every verb that prints it (list, list --group, info, fleet list,
fleet list --group, fleet info) prints those bytes only escaped (corehandler/printable.py)."""

from __future__ import annotations

import json
import os
import re
import shutil

import pytest

from corehandler.cli import main
from corehandler.config import UploadConfig, toml_value
from corehandler.daemon import Settings
from corehandler.fleet import upload
from corehandler.store import upload_queue
from corehandler.store.index import Store
from support import realcore
from support.daemon_harness import Running, wait_for

pytestmark = pytest.mark.s3

HOSTILE = "\x1b]0;owned\x07\x1b[2J\x9b31m\u0085\u202e"
# What must never reach a terminal raw: C0 controls but newline, DEL, C1 controls, bidi embeddings/overrides
# and isolates.
RAW = re.compile("[\x00-\x09\x0b-\x1f\x7f-\x9f\u200e\u200f\u202a-\u202e\u2066-\u2069]")


@pytest.fixture(scope="module", autouse=True)
def _tools():
    for tool in ("gdb", "eu-stack", "gcc"):
        if not shutil.which(tool):
            pytest.fail(f"{tool} is missing: scripts/install-deps installs it (scripts/apt/*.txt)")


def test_every_verb_prints_a_hostile_crash_escaped(tmp_path, s3, capsys):
    # The program's directory and its package note carry the escapes: its frames' module, its module list,
    # its exe and its package fields do too.
    where = tmp_path / f"bin{HOSTILE}"
    note = {"type": "deb", "name": f"pkg{HOSTILE}", "version": f"1{HOSTILE}", "architecture": "amd64"}
    binary = realcore.build(where, "-Xlinker", f"--package-metadata={json.dumps(note)}", name="analysed")
    c = realcore.crash(binary, tmp_path / "core", "segv")
    state, etc = tmp_path / "state", tmp_path / "etc"
    (etc / "corehandler.d").mkdir(parents=True)
    bucket = s3.new_bucket()
    creds = s3.credentials_file(tmp_path / "credentials")
    section = {"url": f"s3://{bucket}/fleet", "endpoint": s3.endpoint, "credentials_file": str(creds),
               "host": "alpha", "retry_initial": "100ms", "retry_max": "1s"}
    (etc / "corehandler.d" / "50-upload.toml").write_text(
        "[upload]\n" + "".join(f"{k} = {toml_value(v)}\n" for k, v in section.items()))
    dump_id = realcore.spool(c, state / "spool", comm=f"c{HOSTILE}"[:15])
    uploader = upload.Uploader(UploadConfig.model_validate(section), state)

    def uploaded():
        if not (state / "index.sqlite").exists():
            return False
        with Store(state, readonly=True) as store:
            stats = upload_queue.stats(store.db)  # None until the uploader made its table
            return bool(stats) and stats["states"]["done"] == 1
    with Running(Settings(state, threads=1, sweep_interval=3600), [uploader]):
        wait_for(uploaded, what="the dump indexed and uploaded", timeout=120)

    os.environ["XDG_CACHE_HOME"] = str(tmp_path / "cache")
    try:
        outputs = {}
        for argv in (["list"], ["list", "--group"], ["info", dump_id, "--all-threads"], ["fleet", "list"],
                     ["fleet", "list", "--group"], ["fleet", "info", dump_id]):
            capsys.readouterr()
            code = main(["--config-dir", str(etc), "--state-dir", str(state), *argv])
            out, err = capsys.readouterr()
            assert code == 0, (argv, err)
            outputs[" ".join(argv)] = out + err
    finally:
        del os.environ["XDG_CACHE_HOME"]
    for verb, out in outputs.items():
        assert not RAW.search(out), (verb, RAW.findall(out), out)
    info = outputs[f"info {dump_id} --all-threads"]
    # The bytes were there, and shown escaped: in the trace's module, the module list and the package note.
    escaped = "\\x1b]0;owned\\x07\\x1b[2J\\u009b31m\\u0085\\u202e"
    assert "crash_segv (analysed + " in info
    assert f"bin{escaped}/analysed build-id" in info and f"version=1{escaped}" in info
    assert escaped in outputs["fleet info " + dump_id] and escaped in outputs["list"]

"""csplice's settings file: every key takes effect; a missing, unreadable or garbage file means the built-in
defaults (whose spool is the fixed /var/lib/corehandler/spool) and a warning in the record's errors.

The fallback cases write to the default spool, so they run in a private mount namespace with a test directory
bound over /var/lib: the host's spool is never touched."""

from __future__ import annotations

import os
import subprocess
from pathlib import Path

import pytest

import corehandler
from corehandler import paths
from support.csplice_harness import Handler, MiB

DEFAULT_SPOOL = "/var/lib/corehandler/spool"


def test_every_setting_reaches_the_record(tmp_path):
    settings = {
        "strategy": "splice2", "chunk_size": 131072, "pipe_size": 262144, "max_dump_size": 5 * MiB,
        "min_free": 4096, "max_pending": 10, "max_per_exe_per_minute": 9, "timeout": 77, "fsync": True,
        "sparse": False, "io_realtime": True, "collect_environ": True, "collect_maps": True,
    }
    handler = Handler(tmp_path / "h", settings={**settings, "some_future_key": "ignored"})
    rec = handler.feed(MiB).record
    s = rec["handler"]["settings"]
    assert (s["from_file"], s["source"], s["error"]) == (True, str(handler.settings_path), None)
    assert {k: s[k] for k in (*settings, "spool_dir")} == {**settings, "spool_dir": str(handler.spool)}
    # The collected extras are in the record.
    own_environ = Path("/proc/self/environ").read_bytes().split(b"\0")[:-1]
    assert [e.encode("utf-8", "surrogateescape") for e in rec["proc"]["environ"]] == own_environ
    assert "[stack]" in rec["proc"]["maps"]
    assert rec["capture"]["strategy"] == "splice2" and rec["errors"] == []


def test_the_dump_is_written_in_the_realtime_io_class_where_asked_and_granted(tmp_path):
    """io_realtime (off by default) puts the copy's writes, and its writer threads', in the realtime I/O class;
    root is granted it, anyone else is refused and the capture goes on all the same. The record says which."""
    off = Handler(tmp_path / "off").feed(4 * MiB).record
    assert off["handler"]["settings"]["io_realtime"] is False
    assert off["capture"]["io_realtime"] is False and off["capture"]["complete"]
    for strategy in ("rw", "direct"):
        rec = Handler(tmp_path / strategy, settings={"io_realtime": True, "strategy": strategy}).feed(4 * MiB).record
        assert rec["capture"]["io_realtime"] is (os.geteuid() == 0) and rec["capture"]["complete"]


def test_environ_and_maps_are_left_out_by_default(tmp_path):
    rec = Handler(tmp_path / "h").feed(4096).record
    assert "environ" not in rec["proc"] and "maps" not in rec["proc"]


BAD_FILES = {
    "missing": None,
    "directory": "dir",
    "garbage": b"\x00\xff\x13binary garbage without an equals sign\n",
    "bad_value": b"strategy=zerocopy\n",
    "out_of_range": b"chunk_size=12\n",
    "percent_over_100": b"min_free=101%\n",
    "percent_not_a_number": b"min_free=x%\n",
    "negative": b"max_pending=-1\n",
    "relative_spool": b"spool_dir=spool\n",
    "too_big": b"# padding\n" * 7000,
}


@pytest.mark.root
@pytest.mark.parametrize("case", BAD_FILES)
def test_bad_settings_file_means_defaults_and_a_warning(tmp_path, case):
    var_lib = tmp_path / "var-lib"
    handler = Handler(var_lib / "corehandler")
    assert str(handler.spool).endswith("/corehandler/spool")
    bad = tmp_path / "csplice.conf"
    content = BAD_FILES[case]
    if content == "dir":
        bad.mkdir()
    elif content is not None:
        # Valid lines around the bad one: a half-applied file is not what we get either.
        # not the host's: a private file (CSPLICE_SETTINGS)
        bad.write_bytes(b"spool_dir=" + bytes(tmp_path) + b"/elsewhere\nstrategy=splice\n" + content)
    handler.settings_path = bad
    # The kernel's view of the filesystem, except that /var/lib is ours.
    handler.wrapper = ["unshare", "--mount", "--propagation", "private", "sh", "-c",
                       f'mount --bind "{var_lib}" /var/lib && exec "$@"', "sh"]
    result = handler.feed(2 * MiB)
    assert result.returncode == 0, result.stderr
    s = result.record["handler"]["settings"]
    assert (s["from_file"], s["source"], s["spool_dir"], s["strategy"]) == \
        (False, "built-in defaults", DEFAULT_SPOOL, "rw")
    assert s["error"] and str(bad) in s["error"]
    assert s["error"] in result.record["errors"]
    assert result.capture["complete"] and result.capture["bytes"] == 2 * MiB
    assert not (tmp_path / "elsewhere").exists()


@pytest.mark.root
def test_a_relative_settings_path_is_refused_aloud(tmp_path, monkeypatch):
    """A relative CSPLICE_SETTINGS would be read from wherever csplice was started: never followed, and said."""
    var_lib = tmp_path / "var-lib"
    handler = Handler(var_lib / "corehandler")
    decoy = tmp_path / "csplice.conf"
    # not the host's: a file a relative name would find from this directory
    decoy.write_text(f"spool_dir={tmp_path}/elsewhere\n")
    monkeypatch.chdir(tmp_path)
    handler.settings_path = Path("csplice.conf")
    handler.wrapper = ["unshare", "--mount", "--propagation", "private", "sh", "-c",
                       f'mount --bind "{var_lib}" /var/lib && exec "$@"', "sh"]
    result = handler.feed(1 * MiB)
    assert result.returncode == 0, result.stderr
    s = result.record["handler"]["settings"]
    assert (s["from_file"], s["source"], s["spool_dir"]) == (False, "built-in defaults", DEFAULT_SPOOL)
    assert "CSPLICE_SETTINGS=csplice.conf is not an absolute path" in s["error"] and s["error"] in result.stderr
    assert not (tmp_path / "elsewhere").exists()


def test_version():
    out = subprocess.run([str(paths.csplice_path()), "--version"], capture_output=True, text=True, check=True)
    assert out.stdout.strip() == corehandler.__version__


def test_no_arguments_is_a_usage_error():
    proc = subprocess.run([str(paths.csplice_path())], input=b"", capture_output=True,
                          env={"CSPLICE_LOG_STDERR": "1"})
    assert proc.returncode == 64 and b"Usage" in proc.stderr

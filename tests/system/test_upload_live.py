"""The issue's "done when", on the live kernel: with url, endpoint and credentials_file in a drop-in, a real
crash appears in the bucket as a verified core plus sidecar, in `fleet list --json`, and comes back from
`fleet get` byte-identical to what csplice captured."""

from __future__ import annotations

import json
import os
import signal

import pytest
from test_daemon_live import live, logged, serve, sha_of, stop  # noqa: F401 (live is a fixture)  # pyflakes: ignore

from support.crash import build_crasher, crash
from support.daemon_harness import wait_for

pytestmark = [pytest.mark.root, pytest.mark.live_kernel, pytest.mark.s3]


def test_a_real_crash_reaches_the_bucket_and_comes_back_identical(live, s3, tmp_path):  # noqa: F811
    state, etc, cli, base = live
    bucket = s3.new_bucket()
    creds = s3.credentials_file(tmp_path / "credentials")
    (etc / "corehandler.d").mkdir()
    (etc / "corehandler.d" / "50-fleet.toml").write_text(
        f'[upload]\nurl = "s3://{bucket}/fleet"\nendpoint = "{s3.endpoint}"\ncredentials_file = "{creds}"\n'
        'host = "live-host"\n')
    crasher = build_crasher(tmp_path / "bin")
    proc = serve(base)
    try:
        r = crash(crasher, "segv", mib=8)
        assert r.returncode == -signal.SIGSEGV

        def listed():
            out = cli("--json", "fleet", "list", "--days", "2", env=dict(os.environ, XDG_CACHE_HOME=str(tmp_path)))
            return json.loads(out.stdout) if out.returncode == 0 else []
        wait_for(lambda: listed(), what="the crash in `fleet list`", timeout=60)
    finally:
        log = stop(proc)
    assert "Uploaded" in log
    [row] = listed()
    assert row["host"] == "live-host" and row["exe"] == str(crasher) and row["core"]
    local, fetched = tmp_path / "local.core", tmp_path / "fleet.core"
    assert cli("dump", "-o", str(local)).returncode == 0  # verified against the capture's sha256 in the index
    got = cli("fleet", "get", row["id"], "-o", str(fetched))
    assert got.returncode == 0, got.stderr
    assert sha_of(fetched) == sha_of(local)
    info = json.loads(cli("--json", "fleet", "info", row["id"]).stdout)
    assert info["sha256"] == sha_of(local) and info["record"]["proc"]["exe"] == str(crasher)
    assert "environ" not in info["record"]["proc"]
    status = cli("status").stdout.decode()
    assert "0 waiting, 1 done" in status


def test_sighup_turns_uploads_on_and_off_without_a_restart(live, s3, tmp_path):  # noqa: F811
    """[upload] applies on a reload: on, the dump indexed before goes up; off, a new crash stays home and
    nothing waits in the queue."""
    state, etc, cli, base = live
    bucket = s3.new_bucket()
    creds = s3.credentials_file(tmp_path / "credentials")
    (etc / "corehandler.d").mkdir()
    drop_in = etc / "corehandler.d" / "50-fleet.toml"
    crasher = build_crasher(tmp_path / "bin")
    env = dict(os.environ, XDG_CACHE_HOME=str(tmp_path))

    def listed():
        out = cli("--json", "fleet", "list", "--days", "2", env=env)
        return json.loads(out.stdout) if out.returncode == 0 else []

    def indexed(n):
        return len(json.loads(cli("--json", "list").stdout)) == n

    proc = serve(base)
    try:
        assert crash(crasher, "segv", mib=4).returncode == -signal.SIGSEGV
        wait_for(lambda: indexed(1), what="the first crash indexed", timeout=60)
        on = (f'[upload]\nurl = "s3://{bucket}/fleet"\nendpoint = "{s3.endpoint}"\ncredentials_file = "{creds}"\n'
              'host = "reloaded"\n')
        drop_in.write_text(on)
        proc.send_signal(signal.SIGHUP)
        wait_for(lambda: len(listed()) == 1, what="the first crash in the bucket after SIGHUP", timeout=60)

        drop_in.write_text('[upload]\nurl = ""\n')
        proc.send_signal(signal.SIGHUP)
        wait_for(lambda: logged(proc, "uploads off"), what="the uploader turned off", timeout=30)
        assert crash(crasher, "segv", mib=4).returncode == -signal.SIGSEGV
        wait_for(lambda: indexed(2), what="the second crash indexed", timeout=60)
    finally:
        log = stop(proc)
    assert "Reload failed" not in log
    assert "0 waiting, 1 done" in cli("status").stdout.decode()
    drop_in.write_text(on)  # for `fleet list`; the daemon is stopped
    assert [row["host"] for row in listed()] == ["reloaded"]  # the second crash stayed home

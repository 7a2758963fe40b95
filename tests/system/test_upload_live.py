"""The issue's "done when", on the live kernel: with url, endpoint and credentials_file in a drop-in, a real
crash appears in the bucket as a verified core plus sidecar, in `fleet list --json`, and comes back from
`fleet get` byte-identical to what csplice captured."""

from __future__ import annotations

import json
import os
import signal

import pytest

from support.crash import build_crasher, crash
from support.daemon_harness import wait_for
from test_daemon_live import live, serve, sha_of, stop  # noqa: F401 (live is a fixture)  # pyflakes: ignore

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

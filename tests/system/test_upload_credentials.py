"""[upload]'s credentials through botocore's chain against a real S3 server (SeaweedFS on loopback): the
environment, a named profile (in the file or from $AWS_PROFILE), and credential_process, each used by the same
client the uploader and `fleet` use. The STS parts (role_arn, web identity) are in tests/unit/test_credentials.py."""

from __future__ import annotations

import json
from pathlib import Path

import pytest

from corehandler.config import UploadConfig
from corehandler.fleet import bucket
from support import awsenv
from support.s3server import ACCESS_KEY, SECRET_KEY

pytestmark = pytest.mark.s3

PROCESS = """#!/bin/sh
echo '{json}'
"""


@pytest.fixture
def aws_home(tmp_path, monkeypatch):
    return awsenv.isolate(monkeypatch, tmp_path)


def round_trip(s3, name: str | None = None, **upload) -> None:
    name = name or s3.new_bucket()
    cfg = UploadConfig.model_validate({"url": f"s3://{name}/fleet", "endpoint": s3.endpoint, "region": "us-east-1",
                                       **upload})
    client = bucket.client(cfg)
    client.put_object(Bucket=name, Key="fleet/k", Body=b"core bytes")
    assert client.get_object(Bucket=name, Key="fleet/k")["Body"].read() == b"core bytes"


def test_credentials_from_the_environment(s3, aws_home, monkeypatch):
    monkeypatch.setenv("AWS_ACCESS_KEY_ID", ACCESS_KEY)
    monkeypatch.setenv("AWS_SECRET_ACCESS_KEY", SECRET_KEY)
    round_trip(s3)


def test_a_named_profile_from_the_config_or_aws_profile(s3, aws_home, monkeypatch):
    creds = awsenv.private(aws_home / "credentials", f"[default]\naws_access_key_id = {ACCESS_KEY}\n"
                    "aws_secret_access_key = wrong\n"
                    f"[fleet]\naws_access_key_id = {ACCESS_KEY}\naws_secret_access_key = {SECRET_KEY}\n")
    round_trip(s3, credentials_file=creds, profile="fleet")
    name = s3.new_bucket()  # the test server's own client is boto3's default session: before AWS_PROFILE
    monkeypatch.setenv("AWS_PROFILE", "fleet")
    round_trip(s3, name, credentials_file=creds)
    monkeypatch.delenv("AWS_PROFILE")
    with pytest.raises(Exception) as refused:  # the default profile's secret is wrong: S3 says so
        round_trip(s3, credentials_file=creds)
    assert bucket.classify(refused.value).reason == "credentials"


def test_credential_process_in_the_config_file(s3, aws_home):
    process = aws_home / "fetch-credentials"
    process.write_text(PROCESS.format(json=json.dumps({"Version": 1, "AccessKeyId": ACCESS_KEY,
                                                       "SecretAccessKey": SECRET_KEY})))
    process.chmod(0o700)
    config = awsenv.private(aws_home / "config", f"[profile fleet]\ncredential_process = {process}\n")
    round_trip(s3, config_file=config, profile="fleet")


def test_a_reload_builds_the_credential_chain_anew(tmp_path, s3, aws_home, feeder, csplice):
    """Keys rotated in place (a file rewritten, a credential_process that now answers another key) are used
    after a reload (SIGHUP: serve's reload hands the uploader its [upload] section, unchanged), not only once
    the old key fails: the uploader builds its client, and so botocore's chain, anew. credential_process
    shows each time the chain is asked."""
    from support.daemon_harness import Running, wait_for
    from support.fleethost import Host

    calls = tmp_path / "calls"
    process = tmp_path / "fetch-credentials"
    process.write_text("#!/bin/sh\necho asked >> " + str(calls) + "\n" + PROCESS.split("\n", 1)[1].format(
        json=json.dumps({"Version": 1, "AccessKeyId": ACCESS_KEY, "SecretAccessKey": SECRET_KEY})))
    process.chmod(0o700)
    config = awsenv.private(tmp_path / "aws-config", f"[default]\ncredential_process = {process}\n")
    host = Host(tmp_path, s3, s3.new_bucket(), "rotating", credentials_file="", config_file=str(config))
    host.crash(feeder, csplice, pid=5101)
    uploader = host.uploader()
    with Running(host.settings, [uploader]):
        wait_for(lambda: host.done() == 1, what="the first upload")
        assert calls.read_text().count("asked") == 1
        uploader.reconfigure(uploader.config)
        host.crash(feeder, csplice, pid=5102)
        wait_for(lambda: host.done() == 2, what="the upload after the reload", timeout=60)
    assert calls.read_text().count("asked") == 2


OLD_KEY = ("AKIAROTATEDOLD000001", "old-secret-key-0123456789abcdef")
NEW_KEY = ("AKIAROTATEDNEW000002", "new-secret-key-0123456789abcdef")


def test_keys_rotated_in_place_are_used_from_sighup_on(tmp_path, s3_private, aws_home, feeder, csplice):
    """A key rotation as an admin does it, against the real server with two identities: a new key issued, the
    credentials file rewritten in place, SIGHUP, then the old key revoked. From SIGHUP on the daemon signs
    with the new key: the revocation costs it no failed request, without a restart. Both ways of naming the
    file: [upload] credentials_file, and AWS_SHARED_CREDENTIALS_FILE in the daemon's environment. A daemon
    not reloaded keeps the old key until it is refused (then, its queue held by that failure, it builds its
    client anew and takes the file's new key)."""
    import os
    import signal
    import subprocess
    import sys

    from support.daemon_harness import wait_for
    from support.fleethost import Host

    s3 = s3_private
    s3.set_identities({"old": OLD_KEY, "new": NEW_KEY})
    s3.stop()
    s3.start()
    bucket = s3.new_bucket()
    by_config = Host(tmp_path, s3, bucket, "by-config")
    by_env = Host(tmp_path, s3, bucket, "by-env", credentials_file="")
    not_reloaded = Host(tmp_path, s3, bucket, "not-reloaded")
    hosts = (by_config, by_env, not_reloaded)
    files = {h.name: Path(h.upload["credentials_file"]) for h in (by_config, not_reloaded)}
    files[by_env.name] = tmp_path / "shared-credentials"
    for host in hosts:
        s3.credentials_file(files[host.name], access=OLD_KEY[0], secret=OLD_KEY[1])
        (host.config_dir / "corehandler.toml").write_text("[metrics]\nenabled = false\n[journal]\nenabled = false\n"
                                                          "[analysis]\nenabled = false\n")
    logs = {h.name: tmp_path / f"{h.name}.log" for h in hosts}

    def serve(host: Host, **env):
        with open(logs[host.name], "wb") as log:
            return subprocess.Popen([sys.executable, "-P", "-m", "corehandler", "--config-dir", str(host.config_dir),
                                     "--state-dir", str(host.state), "serve"], stdout=subprocess.DEVNULL,
                                    stderr=log, env=dict(os.environ, **env))

    def crash_each(pid: int, n: int) -> None:
        for i, host in enumerate(hosts):
            host.crash(feeder, csplice, size=1 << 16, pid=pid + i, keep_core=False)
        wait_for(lambda: all(h.done() == n for h in hosts), what=f"upload {n} of every host", timeout=90)

    procs = {by_config.name: serve(by_config), not_reloaded.name: serve(not_reloaded),
             by_env.name: serve(by_env, AWS_SHARED_CREDENTIALS_FILE=str(files[by_env.name]))}
    try:
        crash_each(6100, 1)
        inodes = {name: path.stat().st_ino for name, path in files.items()}
        for path in files.values():
            s3.credentials_file(path, access=NEW_KEY[0], secret=NEW_KEY[1])
        assert {name: path.stat().st_ino for name, path in files.items()} == inodes  # in place
        for name in (by_config.name, by_env.name):
            procs[name].send_signal(signal.SIGHUP)
        wait_for(lambda: all("Upload configuration reloaded" in logs[h.name].read_text() for h in hosts[:2]),
                 what="both reloads", timeout=30)
        crash_each(6200, 2)
        assert [h.failures() for h in hosts] == [0, 0, 0]  # both keys are good until the old is revoked

        s3.set_identities({"new": NEW_KEY})
        s3.stop()
        s3.start()
        crash_each(6300, 3)
        assert [h.failures() for h in hosts[:2]] == [0, 0]  # reloaded: the new key from SIGHUP on
        assert not_reloaded.failures() >= 1 and "credentials" in logs[not_reloaded.name].read_text()
    finally:
        for proc in procs.values():
            proc.send_signal(signal.SIGTERM)
        codes = [proc.wait(timeout=60) for proc in procs.values()]
    assert codes == [0, 0, 0]
    assert "Upload configuration reloaded" not in logs[not_reloaded.name].read_text()
    assert len([k for k in s3.keys(bucket, "fleet/v2/dt=") if k.endswith(".json")]) == 9

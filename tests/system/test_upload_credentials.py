"""[upload]'s credentials through botocore's chain against a real S3 server (SeaweedFS on loopback): the
environment, a named profile (in the file or from $AWS_PROFILE), and credential_process, each used by the same
client the uploader and `fleet` use. The STS parts (role_arn, web identity) are in tests/unit/test_credentials.py."""

from __future__ import annotations

import json

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

"""[upload]'s credentials through botocore's own chain, for the parts that need AWS STS: a profile's role_arn
with source_profile, and web identity (EKS's AWS_WEB_IDENTITY_TOKEN_FILE and AWS_ROLE_ARN), on moto's STS and
S3 in this process (no real STS is reachable here). The environment, profiles and credential_process against a
real S3 server are in tests/system/test_upload_credentials.py."""

from __future__ import annotations

import os

import pytest

from corehandler.config import UploadConfig
from corehandler.fleet import bucket
from support import awsenv

moto = pytest.importorskip("moto", reason="moto is a test dependency (scripts/pip/test.txt)")

ROLE = "arn:aws:iam::123456789012:role/corehandler-upload"


@pytest.fixture
def aws_home(tmp_path, monkeypatch):
    return awsenv.isolate(monkeypatch, tmp_path)


def used_key(client) -> str:
    creds = client._request_signer._credentials.get_frozen_credentials()
    return creds.access_key


def test_a_profile_with_role_arn_and_source_profile_assumes_the_role(aws_home):
    creds = awsenv.private(aws_home / "credentials",
                           "[base]\naws_access_key_id = AKIABASE\naws_secret_access_key = s\n")
    config = awsenv.private(aws_home / "config",
                            f"[profile upload]\nrole_arn = {ROLE}\nsource_profile = base\nregion = us-east-1\n")
    cfg = UploadConfig.model_validate({"url": "s3://fleet-role", "credentials_file": creds, "config_file": config,
                                       "profile": "upload"})
    with moto.mock_aws():
        client = bucket.client(cfg)
        client.create_bucket(Bucket="fleet-role")
        client.put_object(Bucket="fleet-role", Key="k", Body=b"core")
        # Temporary credentials from STS AssumeRole, not the source profile's key.
        assert used_key(client).startswith("ASIA") and used_key(client) != "AKIABASE"
        assert client.get_object(Bucket="fleet-role", Key="k")["Body"].read() == b"core"


def test_web_identity_from_the_environment_as_on_eks(aws_home, monkeypatch):
    token = aws_home / "token"
    token.write_text("eyJhbGciOiJSUzI1NiJ9.eyJzdWIiOiJzeXN0ZW06c2VydmljZWFjY291bnQifQ.c2ln")
    monkeypatch.setenv("AWS_WEB_IDENTITY_TOKEN_FILE", str(token))
    monkeypatch.setenv("AWS_ROLE_ARN", ROLE)
    cfg = UploadConfig.model_validate({"url": "s3://fleet-eks", "region": "us-east-1"})
    with moto.mock_aws():
        # moto puts fake keys in the environment, which come first in the chain: a pod has none.
        # (emptied, not removed: moto removes them itself on exit; botocore skips empty ones)
        for name in ("AWS_ACCESS_KEY_ID", "AWS_SECRET_ACCESS_KEY"):
            os.environ[name] = ""
        client = bucket.client(cfg)
        client.create_bucket(Bucket="fleet-eks")
        client.put_object(Bucket="fleet-eks", Key="k", Body=b"core")
        assert used_key(client).startswith("ASIA")


def test_no_credentials_anywhere_is_a_credentials_problem(aws_home):
    cfg = UploadConfig.model_validate({"url": "s3://fleet-none", "region": "us-east-1"})
    client = bucket.client(cfg)
    with pytest.raises(Exception) as raised:
        client.head_bucket(Bucket="fleet-none")
    assert bucket.classify(raised.value).reason == "credentials"

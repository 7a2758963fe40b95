"""An AWS environment of the test's own: no setting of the host's or the shell's reaches botocore's chain."""

from __future__ import annotations

from pathlib import Path

AWS_VARIABLES = ("AWS_ACCESS_KEY_ID", "AWS_SECRET_ACCESS_KEY", "AWS_SESSION_TOKEN", "AWS_PROFILE", "AWS_ROLE_ARN",
                 "AWS_WEB_IDENTITY_TOKEN_FILE", "AWS_CONFIG_FILE", "AWS_SHARED_CREDENTIALS_FILE",
                 "AWS_DEFAULT_REGION")


def isolate(monkeypatch, home: Path) -> Path:
    """HOME is `home` (no ~/.aws), no AWS_* variable, no instance metadata lookups; returns home."""
    for name in AWS_VARIABLES:
        monkeypatch.delenv(name, raising=False)
    monkeypatch.setenv("HOME", str(home))
    monkeypatch.setenv("AWS_EC2_METADATA_DISABLED", "true")
    return home


def private(path: Path, text: str) -> str:
    """A file only its owner may read, as [upload] requires of the shared files; its path."""
    path.write_text(text)
    path.chmod(0o600)
    return str(path)

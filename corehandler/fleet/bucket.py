"""The fleet's bucket: its key layout, the S3 client made from [upload], and what its errors mean.

Layout (docs/design.md, "Fleet objects"), under the URL's PREFIX:
  v1/HOST/YYYY/MM/DD/ID.zst     the compressed core (ID.core when the store keeps cores uncompressed)
  v1/HOST/YYYY/MM/DD/ID.json    its sidecar, written last, after the core is verified
  v1/budget/SIG/DAY/0..N-1      the fleet budget's slots, each claimed by one conditional create
The date is the crash's (UTC), so a dump retried across midnight keeps its key and its budget day.
"""

from __future__ import annotations

import configparser
import datetime
import os
import re
import socket
import stat
from dataclasses import dataclass
from pathlib import Path

from corehandler.errors import EXIT_CONFIG, EXIT_PERMISSION, CorehandlerError

LAYOUT = "v1"
SIDECAR_SUFFIX = ".json"
BUDGET = "budget"


class BucketError(CorehandlerError):
    """The bucket cannot be reached or refused us; `reason` is one of REASONS."""

    def __init__(self, message: str, reason: str = "server"):
        super().__init__(message)
        self.reason = reason


class UploadConfigError(CorehandlerError):
    exit_code = EXIT_CONFIG


class CredentialsFileError(CorehandlerError):
    exit_code = EXIT_PERMISSION


# Why a request failed. The first four are the bucket's configuration, not this dump: they hold the whole
# queue (one line in status, no retry storm) until a retry succeeds.
REASONS = ("credentials", "bucket", "clock_skew", "tls", "connection", "throttled", "server", "local")
QUEUE_WIDE = ("credentials", "bucket", "clock_skew", "tls", "connection", "throttled")

_CODES = {
    "InvalidAccessKeyId": "credentials", "SignatureDoesNotMatch": "credentials", "AccessDenied": "credentials",
    "InvalidToken": "credentials", "ExpiredToken": "credentials", "403": "credentials", "Forbidden": "credentials",
    "NoSuchBucket": "bucket", "404": "bucket", "NotFound": "bucket", "InvalidBucketName": "bucket",
    "RequestTimeTooSkewed": "clock_skew",
    "SlowDown": "throttled", "Throttling": "throttled", "503": "throttled", "ServiceUnavailable": "throttled",
}
_ADVICE = {
    "credentials": "check upload.credentials_file and the key's permissions on the bucket",
    "bucket": "create the bucket or fix upload.url",
    "clock_skew": "this host's clock is off; fix NTP",
    "tls": "check upload.ca_bundle and the endpoint's certificate",
    "connection": "the endpoint does not answer",
}


def classify(error: BaseException) -> BucketError:
    """A BucketError with one clear line for any failure of a bucket request."""
    from botocore import exceptions as bx  # boto3 loads slowly: only when the bucket is used

    if isinstance(error, BucketError):
        return error
    if isinstance(error, bx.ClientError):
        err = error.response.get("Error", {})
        code = str(err.get("Code", ""))
        status = error.response.get("ResponseMetadata", {}).get("HTTPStatusCode")
        reason = _CODES.get(code) or _CODES.get(str(status)) or "server"
        text = f"{error.operation_name}: {code or status}" + (f" ({err['Message']})" if err.get("Message") else "")
    elif isinstance(error, bx.SSLError):
        reason, text = "tls", f"TLS: {error}"
    elif isinstance(error, (bx.EndpointConnectionError, bx.ConnectionClosedError, bx.ReadTimeoutError,
                            bx.ConnectTimeoutError, bx.ConnectionError)):
        reason, text = "connection", str(error)
    elif isinstance(error, (bx.NoCredentialsError, bx.PartialCredentialsError)):
        reason, text = "credentials", str(error)
    elif isinstance(error, OSError):
        reason, text = "local", f"{getattr(error, 'filename', '') or ''}: {error.strerror or error}".lstrip(": ")
    else:
        reason, text = "server", f"{type(error).__name__}: {error}"
    advice = _ADVICE.get(reason)
    return BucketError(f"{text}" + (f"; {advice}" if advice else ""), reason)


@dataclass(frozen=True)
class Target:
    """Where this host's objects go."""
    bucket: str
    prefix: str   # without slashes at either end; "" = the bucket's root
    host: str

    def key(self, *parts: str) -> str:
        return "/".join(p for p in (self.prefix, LAYOUT, *parts) if p)

    def root(self) -> str:
        """The prefix every host's directory is under (ends with /)."""
        return self.key() + "/"

    def day_prefix(self, host: str, day: datetime.date) -> str:
        return self.key(host, f"{day:%Y/%m/%d}") + "/"

    def dump_key(self, crashed_at: float, dump_id: str, suffix: str, host: str | None = None) -> str:
        return self.day_prefix(host or self.host, crash_day(crashed_at)) + dump_id + suffix

    def budget_slot(self, signature_key: str, day: str, slot: int) -> str:
        return self.key(BUDGET, signature_key, day, str(slot))


def crash_day(crashed_at: float) -> datetime.date:
    return datetime.datetime.fromtimestamp(crashed_at, datetime.timezone.utc).date()


def id_day(dump_id: str) -> datetime.date | None:
    """The crash day a dump id carries (its first field is CLOCK_REALTIME µs), or None."""
    try:
        return crash_day(int(dump_id.split("-", 1)[0]) / 1e6)
    except (ValueError, OverflowError, OSError):
        return None


def host_name(config) -> str:
    """upload.host, or this machine's host name made safe for a key."""
    name = config.host or socket.gethostname()
    return re.sub(r"[^A-Za-z0-9._-]", "_", name).strip(".") or "localhost"


def target(config) -> Target:
    if not config.url:
        raise UploadConfigError("no bucket configured: set upload.url = \"s3://BUCKET/PREFIX\"")
    return Target(config.bucket, config.prefix, host_name(config))


def _parse_problem(e: Exception) -> str:
    """What is wrong with a credentials file, by line number only: configparser's own message quotes the
    offending line, which may be the secret itself, and this message goes to the log and to `status`."""
    if isinstance(e, UnicodeDecodeError):
        return f"not UTF-8 (byte {e.start})"
    lines = [n for n, _ in getattr(e, "errors", [])] or [getattr(e, "lineno", None)]
    where = ", ".join(str(n) for n in lines if n is not None)
    kind = {"MissingSectionHeaderError": "a line before any [profile]", "ParsingError": "a line that is not "
            "key = value", "DuplicateSectionError": "a duplicate [profile]", "DuplicateOptionError": "a duplicate "
            "key"}.get(type(e).__name__, "malformed")
    return f"{kind}" + (f" (line {where})" if where else "")


def read_credentials(path: Path, profile: str) -> dict:
    """Access key, secret and session token from an AWS shared-credentials file, refused when anyone but
    root (or the user running us) could read it: the key opens every host's dumps."""
    try:
        st = os.stat(path)
    except OSError as e:
        raise CredentialsFileError(f"upload.credentials_file {path}: {e.strerror}") from None
    if st.st_uid not in (0, os.geteuid()) or st.st_mode & (stat.S_IRWXG | stat.S_IRWXO):
        raise CredentialsFileError(f"upload.credentials_file {path} is readable by others (mode "
                                   f"{stat.S_IMODE(st.st_mode):04o}, owner uid {st.st_uid}); "
                                   f"chown root and chmod 0600 it")
    parser = configparser.ConfigParser(interpolation=None)
    try:
        with open(path, encoding="utf-8") as f:
            parser.read_file(f)
    except OSError as e:
        raise CredentialsFileError(f"upload.credentials_file {path}: cannot read: {e.strerror}") from None
    except (UnicodeDecodeError, configparser.Error) as e:
        raise CredentialsFileError(f"upload.credentials_file {path}: cannot read: {_parse_problem(e)}") from None
    if not parser.has_section(profile):
        raise CredentialsFileError(f"upload.credentials_file {path} has no [{profile}] profile")
    section = parser[profile]
    if not section.get("aws_access_key_id") or not section.get("aws_secret_access_key"):
        raise CredentialsFileError(f"upload.credentials_file {path}: [{profile}] needs aws_access_key_id and "
                                   "aws_secret_access_key")
    return {"aws_access_key_id": section["aws_access_key_id"].strip(),
            "aws_secret_access_key": section["aws_secret_access_key"].strip(),
            "aws_session_token": (section.get("aws_session_token") or "").strip() or None}


def client(config, *, pool: int = 16):
    """A boto3 S3 client for [upload]: standard retries, timeouts, TLS verified (ca_bundle if set)."""
    import boto3
    from botocore.config import Config as BotoConfig

    kwargs = read_credentials(Path(config.credentials_file), config.profile) if config.credentials_file else {}
    boto = BotoConfig(
        retries={"mode": "standard", "max_attempts": 3},
        connect_timeout=config.timeout, read_timeout=config.timeout, max_pool_connections=pool,
        request_checksum_calculation="when_supported", response_checksum_validation="when_supported",
        # Other servers than AWS rarely have virtual-host DNS names for their buckets.
        s3={"addressing_style": "path" if config.endpoint else "auto"},
        user_agent_extra="corehandler")
    session = boto3.session.Session()
    return session.client("s3", endpoint_url=config.endpoint or None, region_name=config.region or None,
                          verify=config.ca_bundle or True, config=boto, **kwargs)

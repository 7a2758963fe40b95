"""The fleet's bucket: its key layout, the S3 client made from [upload], and what its errors mean.

Layout (docs/design.md, "Fleet"), under the URL's PREFIX:
  v2/dt=YYYY-MM-DD/host=HOST/ID.zst[.age]   the compressed core (ID.core when the store keeps cores
                                            uncompressed; .age when encrypted to [upload] recipients)
  v2/dt=YYYY-MM-DD/host=HOST/ID.json        its sidecar, written after the core is verified
  v2/index/dt=YYYY-MM-DD/host=HOST/part-NNNNN.parquet   the day's index rows of that host (dataset.py)
  v2/daily/dt=YYYY-MM-DD/index-DIGEST.parquet           a day's index files compacted into one (dataset.py)
  v1/budget/SIG/DAY/0..N-1                  the fleet budget's slots, each claimed by one conditional create
                                            (where v1 hosts claim theirs too: one budget across an upgrade)
  v1/budget/SIG/DAY/root/0..N-1             root's crashes' own slots, which no user's crash takes
  v1/budget/SIG/DAY/user/HOST-UID/0..M-1    one user's share, claimed before a slot of the fleet's
  v1/HOST/YYYY/MM/DD/ID.{zst,core,json}     what hosts of corehandler 0.2 uploaded: still read
The date is the crash's (UTC), so a dump retried across midnight keeps its key and its budget day; `dt=` and
`host=` are Hive-style partitions, which engines prune by.
"""

from __future__ import annotations

import datetime
import re
import socket
from dataclasses import dataclass

from corehandler.errors import EXIT_CONFIG, CorehandlerError
from corehandler.fleet import credentials

LAYOUT = "v2"
V1 = "v1"
INDEX = "index"
SIDECAR_SUFFIX = ".json"
BUDGET = "budget"


class BucketError(CorehandlerError):
    """The bucket cannot be reached or refused us; `reason` is one of REASONS."""

    def __init__(self, message: str, reason: str = "server"):
        super().__init__(message)
        self.reason = reason


class UploadConfigError(CorehandlerError):
    exit_code = EXIT_CONFIG


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
    "credentials": "check upload's credentials (credentials_file, config_file, profile, or the environment) "
                   "and the key's permissions on the bucket",
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

    def key(self, *parts: str, layout: str = LAYOUT) -> str:
        return "/".join(p for p in (self.prefix, layout, *parts) if p)

    def root(self, layout: str = LAYOUT) -> str:
        """The prefix every object of a layout is under (ends with /)."""
        return self.key(layout=layout) + "/"

    def day_prefix(self, host: str, day: datetime.date) -> str:
        return self.key(f"dt={day:%Y-%m-%d}", f"host={host}") + "/"

    def v1_day_prefix(self, host: str, day: datetime.date) -> str:
        return self.key(host, f"{day:%Y/%m/%d}", layout=V1) + "/"

    def index_day_prefix(self, day: datetime.date) -> str:
        return self.key(INDEX, f"dt={day:%Y-%m-%d}") + "/"

    def index_prefix(self, host: str, day: datetime.date) -> str:
        return self.index_day_prefix(day) + f"host={host}/"

    def dump_key(self, crashed_at: float, dump_id: str, suffix: str, host: str | None = None) -> str:
        return self.day_prefix(host or self.host, crash_day(crashed_at)) + dump_id + suffix

    def budget_slot(self, signature_key: str, day: str, slot: int, pool: str = "") -> str:
        """A slot of the fleet's pool, or of `pool` (root, or user/HOST-UID)."""
        return self.key(BUDGET, signature_key, day, pool, str(slot), layout=V1)


HOST_NAME = re.compile(r"[A-Za-z0-9._-]+")


def safe_host(name: str) -> str | None:
    """name when it is one host_name() could have made (a key's segment another host chose), else None."""
    return name if HOST_NAME.fullmatch(name) and name not in (".", "..") else None


def host_of(key: str) -> str | None:
    """The HOST of a v2 key (its first `host=HOST` segment, by the layout's pattern), or None."""
    name = next((p[len("host="):] for p in key.split("/") if p.startswith("host=")), None)
    return safe_host(name) if name is not None else None


class ObjectTooLarge(CorehandlerError):
    """An object bigger than what its reader accepts: left unread."""


def _sized(client, bucket: str, key: str, limit: int):
    """get_object's answer, refused before its body is read when the object is past limit bytes."""
    resp = client.get_object(Bucket=bucket, Key=key)
    size = resp.get("ContentLength")
    if not isinstance(size, int) or size > limit:
        resp["Body"].close()
        raise ObjectTooLarge(f"s3://{bucket}/{key} is {size} bytes, more than the {limit} it may have")
    return resp


def read_bounded(client, bucket: str, key: str, limit: int) -> bytes:
    """The body of a small object (a sidecar, a budget slot, a mini core), never more than limit bytes read:
    another host chose its size."""
    body = _sized(client, bucket, key, limit)["Body"]
    with body:
        data = body.read(limit + 1)
    if len(data) > limit:
        raise ObjectTooLarge(f"s3://{bucket}/{key} is more than the {limit} bytes it may have")
    return data


def download(client, bucket: str, key: str, path, limit: int, chunk: int = 8 << 20) -> None:
    """An object into a local file, never more than limit bytes (checked before and while reading)."""
    with open(path, "wb") as f:
        download_to(client, bucket, key, f, limit, chunk=chunk)


def download_to(client, bucket: str, key: str, out, limit: int, *, chunk: int = 8 << 20, each=None) -> int:
    """An object written to out, never more than limit bytes; each(chunk) hears of every chunk. Its size."""
    body = _sized(client, bucket, key, limit)["Body"]
    total = 0
    with body:
        for part in body.iter_chunks(chunk):
            total += len(part)
            if total > limit:
                raise ObjectTooLarge(f"s3://{bucket}/{key} is more than the {limit} bytes it may have")
            out.write(part)
            if each:
                each(part)
    return total


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


def sse_args(config) -> dict:
    """The server-side encryption arguments of a PUT, from [upload]."""
    extra = {}
    if config.sse:
        extra["ServerSideEncryption"] = config.sse
    if config.sse_kms_key_id:
        extra["SSEKMSKeyId"] = config.sse_kms_key_id
    return extra


def client(config, *, pool: int = 16):
    """A boto3 S3 client for [upload]: botocore's credential chain (credentials.py), standard retries, timeouts,
    TLS verified (ca_bundle if set)."""
    import boto3
    from botocore.config import Config as BotoConfig

    boto = BotoConfig(
        retries={"mode": "standard", "max_attempts": 3},
        connect_timeout=config.timeout, read_timeout=config.timeout, max_pool_connections=pool,
        request_checksum_calculation="when_supported", response_checksum_validation="when_supported",
        # Other servers than AWS rarely have virtual-host DNS names for their buckets.
        s3={"addressing_style": "path" if config.endpoint else "auto"},
        user_agent_extra="corehandler")
    session = boto3.session.Session(botocore_session=credentials.botocore_session(config))
    s3 = session.client("s3", endpoint_url=config.endpoint or None, region_name=config.region or None,
                        verify=config.ca_bundle or True, config=boto)
    s3.meta.events.register("before-sign.s3", _checksummed_body_unsigned)
    return s3


def _checksummed_body_unsigned(request, **_) -> None:
    """A body sent with its SHA-256 in x-amz-checksum-sha256 is not hashed again for the signature (over
    http botocore signs every body; over https it already does this). The header is signed and the server
    refuses a body that does not match it, so UNSIGNED-PAYLOAD gives up nothing, and the second pass over
    every byte of a core is client CPU taken from the server beside it."""
    from botocore.config import Config as BotoConfig

    if "x-amz-checksum-sha256" not in request.headers:
        return
    cfg = request.context.get("client_config")
    if cfg is None or (cfg.s3 or {}).get("payload_signing_enabled") is False:
        return
    # The client's config is shared by every request: this one gets a copy that differs in this alone.
    request.context["client_config"] = cfg.merge(BotoConfig(s3={**(cfg.s3 or {}), "payload_signing_enabled": False}))

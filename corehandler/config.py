"""The configuration: /etc/corehandler/corehandler.toml plus corehandler.d/*.toml drop-ins, validated strictly.

Drop-ins are read in name order after the main file; each value replaces the one before it key by key
within a section, so a drop-in holding `[capture] max_pending = 8` changes only that key. A missing main
file means the defaults. Every error names the file, the key and the value that is wrong.

Values come out parsed: sizes as int bytes, durations as float seconds, min_free/max_use/keep_free as
units.SizeOrPercent. The models are also the documentation: each field's description becomes the comment
above it in the shipped config/corehandler.toml (configtext.render_toml(..., commented_defaults=True)).
"""

from __future__ import annotations

import dataclasses
import ipaddress
import json
import os
import re
import tomllib
from pathlib import Path
from typing import Annotated, Any, Literal

from pydantic import BaseModel, BeforeValidator, ConfigDict, Field, ValidationError, model_validator

from corehandler import units
from corehandler.csplice_contract import STRATEGIES
from corehandler.errors import ConfigError
from corehandler.paths import DEFAULT_STATE_DIR, Paths


@dataclasses.dataclass(frozen=True)
class Human:
    """Marks a field whose value is shown in human units (TOML output, the shipped file)."""

    format: Any


def _checked(parse, fmt, lo, hi):
    def check(value):
        parsed = parse(value)
        if not lo <= parsed <= hi:
            raise ValueError(f"must be between {fmt(lo)} and {fmt(hi)}")
        return parsed

    return check


def Size(lo: int = 0, hi: int = units.MAX_SIZE):  # noqa: N802 (a type factory, read as a type)
    return Annotated[int, BeforeValidator(_checked(units.parse_size, units.format_size, lo, hi)),
                     Human(units.format_size)]


def Duration(lo: float = 0.0, hi: float = units.MAX_DURATION):  # noqa: N802
    return Annotated[float, BeforeValidator(_checked(units.parse_duration, units.format_duration, lo, hi)),
                     Human(units.format_duration)]


def Durations(lo: float, hi: float, most: int):  # noqa: N802
    """A list of at most `most` durations, each between lo and hi."""
    check = _checked(units.parse_duration, units.format_duration, lo, hi)

    def each(value):
        if not isinstance(value, (list, tuple)) or len(value) > most:
            raise ValueError(f"must be a list of at most {most} durations")
        return [check(v) for v in value]

    return Annotated[list[float], BeforeValidator(each), Human(lambda v: [units.format_duration(x) for x in v])]


def _size_or_auto(value):
    return value if value == "auto" else units.parse_size(value)


SizeOrAuto = Annotated[int | Literal["auto"], BeforeValidator(_size_or_auto),
                       Human(lambda v: v if v == "auto" else units.format_size(v))]
def _threads(value):
    """[compression] threads: "auto", or 1..256 workers; 0, which meant one per CPU but one before, is auto."""
    if value == "auto" or value == 0:
        return "auto"
    if isinstance(value, bool) or not isinstance(value, int) or not 1 <= value <= 256:
        raise ValueError('must be "auto" or a number of threads from 1 to 256')
    return value


SizeOrPercent = Annotated[units.SizeOrPercent, BeforeValidator(units.SizeOrPercent.parse), Human(str)]
Count = Annotated[int, Field(ge=0, le=2**31 - 1)]


def _absolute_path(value) -> Path:
    if not isinstance(value, str) or not value.startswith("/"):
        raise ValueError("must be an absolute path")
    if any(ord(c) < 32 or c == "\x7f" for c in value):
        # csplice reads its settings line by line.
        raise ValueError("must not contain control characters")
    if len(value.encode()) > 3000:
        raise ValueError("is too long")
    return Path(os.path.normpath(value))


def _socket_path(value) -> Path:
    path = _absolute_path(value)
    # The kernel's limit (sun_path) and its rule: a normalised absolute path, as core_pattern takes no quoting.
    if len(str(path).encode()) >= 108 or any(c.isspace() for c in str(path)) or str(path) != value:
        raise ValueError("must be a normalised absolute path without spaces, shorter than 108 bytes")
    return path


def _optional_absolute_path(value) -> str:
    if value == "":
        return value
    return str(_absolute_path(value))


def _ip_address(value) -> str:
    if not isinstance(value, str):
        raise ValueError("must be an IP address string")
    try:
        return str(ipaddress.ip_address(value))
    except ValueError:
        raise ValueError("must be an IP address such as 127.0.0.1 or ::1") from None


AbsolutePath = Annotated[Path, BeforeValidator(_absolute_path), Human(str)]


class _Section(BaseModel):
    # strict: TOML has types, so "64" for a count or "yes" for a boolean is a mistake worth reporting.
    model_config = ConfigDict(extra="forbid", frozen=True, strict=True, arbitrary_types_allowed=True)


class CaptureConfig(_Section):
    """csplice's settings: each option reaches csplice.conf under its own name (csplice_contract.render_settings), and
    csplice's table of keys (`csplice --list-settings`) is checked against these fields by a test."""

    strategy: Literal[("auto", *STRATEGIES)] = Field(
        "auto", description=" | ".join(("auto", *STRATEGIES)) + "; auto = what bench/ measured best for this kernel "
                            "(and direct for processes of direct_above or more)")
    chunk_size: Size(4096, 64 << 20) = Field(256 << 10, description="bytes per read/splice call (4K..64M)")
    pipe_size: Size(0, 1 << 30) = Field(1 << 20, description="enlarge the core pipe to this size (F_SETPIPE_SZ); 0 "
                                                       "keeps the kernel's")
    max_dump_size: Size() = Field(32 << 30, description="larger dumps are truncated here and flagged; 0 = no "
                                                        "limit")
    direct_above: SizeOrAuto = Field("auto", description="with strategy auto, a process with this much resident "
                                     "memory (VmRSS) or more is dumped with O_DIRECT writes (strategy direct); 0 = "
                                     "never; auto = from the spool's write rates measured on this host")
    direct_rate: SizeOrAuto = Field("auto", description="with strategy auto, bytes per second the spool takes "
                                    "O_DIRECT writes: a dump written through the page cache moves to O_DIRECT for "
                                    "the rest once 4 MiB of it ran below 3/4 of this; 0 = never; auto = as "
                                    "measured on this host")
    min_free: SizeOrPercent = Field(units.SizeOrPercent(percent=15.0), description="stop writing when the spool's"
                                    " filesystem has less free: a size or a percentage of it")
    max_pending: Count = Field(64, description="records waiting in the spool beyond which crashes are kept as "
                                               "metadata only, of all users but root (root has as many of its "
                                               "own); twice as many and nothing is kept but a count; 0 = no limit")
    max_pending_per_uid: Count = Field(16, description="the same per user: one user's records waiting in the "
                                                       "spool beyond which their crashes are kept as metadata only,"
                                                       " twice as many shed; 0 = max_pending")
    max_per_exe_per_minute: Count = Field(16, description="crashes of one executable by one user per minute that "
                                                          "keep their core (twice as many keep a record); 0 = no "
                                                          "limit")
    timeout: Duration(0, 7 * 86400) = Field(3600.0, description="longest capture before truncating, at most (a "
                                                                "dump gets 60 s plus 1 s per 4 MiB it can hold); "
                                                                "0 = none")
    fsync: bool = Field(False, description="fsync the core before committing its record")
    sparse: bool = Field(True, description="skip writing all-zero pages (the file stays sparse)")
    io_realtime: bool = Field(False, description="write the dump in the realtime I/O class, ahead of writeback and "
                                                 "every other process's I/O (a crash storm then has the disk first)")
    collect_environ: bool = Field(False, description="keep the crashed process's environment (may hold secrets)")
    collect_maps: bool = Field(False, description="keep the crashed process's /proc/PID/maps")


class KernelConfig(_Section):
    """How the kernel hands a dump to csplice (not csplice's per-crash settings: those are [capture])."""

    mode: Literal["pipe", "socket", "auto"] = Field(
        "pipe", description="pipe | socket | auto (install --mode overrides; set in neither, install keeps the mode "
        "it was last asked for): the kernel runs csplice per crash, "
        "or connects to csplice's listener, which can refuse a dump before it is written (Linux 6.17+); auto = "
        "socket where the kernel has it and the listener answers")
    socket_path: Annotated[Path, BeforeValidator(_socket_path), Human(str)] = Field(
        Path("/run/corehandler/capture/coredump.socket"), description="the coredump socket in socket mode "
        "(absolute, shorter than 108 bytes; its directory is made root-only)")
    socket_max_connections: int = Field(16, ge=1, le=4096, description="dumps the listener captures at once in "
                                        "socket mode; more wait in the socket's backlog")


class CompressionConfig(_Section):
    enabled: bool = Field(True, description="compress dumps with zstd in the store")
    level: int = Field(1, ge=1, le=22, description="zstd level (1..22); 1 stores a dump 1.1-2.3x sooner than 3 "
                       "for 10-33% more bytes (bench/results/compress.md)")
    threads: Annotated[int | Literal["auto"], BeforeValidator(_threads)] = Field(
        "auto", description="zstd worker threads per dump, 1..256; auto = one per CPU the daemon may run on, at "
        "its lower priority (nice 5), so that they take only the CPUs the host's own work leaves idle; "
        "a capture that starts pauses the compression whatever the count; 0 = auto")


class RetentionConfig(_Section):
    max_use: SizeOrPercent = Field(units.SizeOrPercent(percent=10.0), description="most the store may use: a size "
                                   "or a percentage of its filesystem")
    keep_free: SizeOrPercent = Field(units.SizeOrPercent(percent=15.0), description="delete oldest dumps while "
                                     "the filesystem has less free than this")
    max_age: Duration() = Field(0.0, description="delete dumps older than this, e.g. \"2w\"; 0 = no limit")
    max_count: Count = Field(0, description="most dumps kept; 0 = no limit")
    max_per_exe: Count = Field(0, description="most dumps kept per executable and user; 0 = no limit")
    dropped_max_age: Duration() = Field(14 * 86400.0, description="delete dumps whose core was not kept "
                                        "(dropped, or invalid without one) older than this; 0 = no limit")
    dropped_max_count: Count = Field(1000, description="most dumps whose core was not kept; 0 = no limit")
    mini_max_use: SizeOrPercent = Field(units.SizeOrPercent(percent=1.0), description="most the mini cores of "
                                        "dumps whose full core is gone may use (the rules above take a dump's full "
                                        "core and keep its mini core)")
    mini_max_age: Duration() = Field(0.0, description="delete dumps left with only a mini core when older than "
                                     "this (set it longer than max_age to keep their stacks longer); 0 = max_age")
    mini_max_count: Count = Field(0, description="most dumps left with only a mini core; 0 = no limit")
    interval: Duration(1, units.MAX_DURATION) = Field(3600.0, description="how often retention runs besides "
                                                                          "after each ingest")


class MetricsConfig(_Section):
    enabled: bool = Field(True, description="serve Prometheus metrics over HTTP")
    listen: Annotated[str, BeforeValidator(_ip_address)] = Field("127.0.0.1", description="address to listen on")
    port: int = Field(9577, ge=1, le=65535, description="TCP port")
    textfile: Annotated[str, BeforeValidator(_optional_absolute_path)] = Field(
        "", description="also write node_exporter textfile metrics here; \"\" = off")
    exe_label_allowlist: list[str] = Field([], description="executables that get their own metric label; "
                                                           "others count as \"other\"")


def _s3_url(value) -> str:
    if not isinstance(value, str):
        raise ValueError("must be a string")
    if value == "":
        return value
    if not value.startswith("s3://"):
        raise ValueError("must be s3://BUCKET or s3://BUCKET/PREFIX")
    bucket, _, prefix = value[len("s3://"):].partition("/")
    if not re.fullmatch(r"[a-z0-9][a-z0-9.-]{1,61}[a-z0-9]", bucket):
        raise ValueError("the bucket must be 3-63 characters of a-z, 0-9, '.' and '-'")
    if any(ord(c) < 32 or c == "\x7f" for c in prefix) or ".." in prefix.split("/"):
        raise ValueError("the prefix must not contain control characters or '..'")
    return "s3://" + bucket + ("/" + prefix.strip("/") if prefix.strip("/") else "")


def _http_url(value) -> str:
    if not isinstance(value, str):
        raise ValueError("must be a string")
    if value and not re.fullmatch(r"https?://[^\s/]+(/\S*)?", value):
        raise ValueError("must be an http:// or https:// URL")
    return value.rstrip("/")


def _host_name(value) -> str:
    if not isinstance(value, str) or not re.fullmatch(r"([A-Za-z0-9][A-Za-z0-9._-]{0,252})?", value):
        raise ValueError("must be a host name: letters, digits, '.', '_' and '-'")
    return value


def _age_recipients(value) -> list:
    if not isinstance(value, list) or not all(isinstance(v, str) for v in value):
        raise ValueError("must be a list of age public keys (age1...)")
    from corehandler.fleet import available, seal  # pyrage loads only for a config that names keys

    if not available.missing():
        seal.recipients(value)
    elif any(not re.fullmatch(r"age1[02-9ac-hj-np-z]+", v.strip()) for v in value):
        # Without pyrage (no corehandler-fleet: uploads stay off) the keys' form only; pyrage checks them once
        # the fleet package is there.
        raise ValueError("must be a list of age public keys (age1...)")
    return [v.strip() for v in value]


def loopback_url(url: str) -> bool:
    """Whether an http(s) URL names a loopback address (127.0.0.0/8, ::1, localhost)."""
    host = re.sub(r"^[a-z]+://", "", url).split("/", 1)[0].rsplit("@", 1)[-1]
    host = host[1:].split("]", 1)[0] if host.startswith("[") else host.rsplit(":", 1)[0] if host.count(":") == 1 \
        else host
    if host == "localhost":
        return True
    try:
        return ipaddress.ip_address(host).is_loopback
    except ValueError:
        return False


class UploadConfig(_Section):
    url: Annotated[str, BeforeValidator(_s3_url)] = Field(
        "", description="s3://BUCKET/PREFIX to upload every dump to; \"\" = off")
    endpoint: Annotated[str, BeforeValidator(_http_url)] = Field(
        "", description="the S3 API's URL for servers other than AWS (MinIO, Ceph RGW, SeaweedFS); \"\" = AWS")
    region: str = Field("", description="the bucket's region; \"\" = the AWS configuration's, else us-east-1")
    credentials_file: Annotated[str, BeforeValidator(_optional_absolute_path)] = Field(
        "", description="AWS shared credentials file (owned by root, mode 0600); \"\" = "
                        "$AWS_SHARED_CREDENTIALS_FILE or ~/.aws/credentials. Credentials come from botocore's "
                        "chain: environment, role_arn, web identity, SSO, these files, credential_process, "
                        "container and instance roles (docs/aws.md)")
    config_file: Annotated[str, BeforeValidator(_optional_absolute_path)] = Field(
        "", description="AWS shared config file (owned by root, mode 0600): profiles with role_arn and "
                        "source_profile, credential_process, sso_*, web_identity_token_file; \"\" = "
                        "$AWS_CONFIG_FILE or ~/.aws/config")
    profile: str = Field("", description="the profile in those files; \"\" = $AWS_PROFILE, else default")
    ca_bundle: Annotated[str, BeforeValidator(_optional_absolute_path)] = Field(
        "", description="PEM file of the CAs that sign the endpoint's certificate; \"\" = the system's")
    allow_http: bool = Field(False, description="allow a plain http:// endpoint that is not on loopback "
                                                "(dumps hold secrets: keep this off)")
    send: Literal["cores", "metadata"] = Field("cores", description="cores = compressed core and sidecar; "
                                               "metadata = the sidecar only")
    send_environ: bool = Field(False, description="include the environment capture.collect_environ kept")
    send_maps: bool = Field(False, description="include the maps capture.collect_maps kept")
    recipients: Annotated[list[str], BeforeValidator(_age_recipients)] = Field(
        [], description="age X25519 public keys (age1...) the core and the sidecar's command line, environment, "
                        "maps and annotations are encrypted to before they leave the host; [] = sent in clear")
    host: Annotated[str, BeforeValidator(_host_name)] = Field(
        "", description="this host's name in object keys; \"\" = the machine's host name")
    bandwidth_limit: Size() = Field(0, description="most bytes per second an upload may send; 0 = no limit")
    part_size: Size(5 << 20, 5 << 30) = Field(16 << 20, description="multipart part size (5M..5G); files "
                                              "larger than one part go up in parts")
    concurrency: int = Field(4, ge=1, le=64, description="parts sent in parallel")
    sse: Literal["", "AES256", "aws:kms"] = Field("", description="server-side encryption: \"\" = the "
                                                  "bucket's default, AES256 = SSE-S3, aws:kms = SSE-KMS")
    sse_kms_key_id: str = Field("", description="the KMS key for sse = \"aws:kms\"; \"\" = the account's "
                                                "default key")
    fleet_budget: Count = Field(0, description="full cores per signature per day across the fleet (the rest "
                                               "send the sidecar only); 0 = no budget")
    fleet_budget_per_uid: Count = Field(0, description="of those, the most one user of one host may take (root's "
                                                       "crashes have fleet_budget of their own); 0 = half of "
                                                       "fleet_budget, at least 1")
    retry_initial: Duration(0.01, 3600) = Field(2.0, description="first retry delay after a failed upload "
                                                "(doubles each attempt, with jitter)")
    retry_max: Duration(1, 86400) = Field(600.0, description="longest retry delay")
    timeout: Duration(1, 3600) = Field(60.0, description="connect and read timeout of one request")

    @model_validator(mode="after")
    def _plain_http(self) -> "UploadConfig":
        # Dumps hold secrets: over plain http they would cross the network readable by anyone on the path.
        if self.endpoint.startswith("http://") and not self.allow_http and not loopback_url(self.endpoint):
            raise ValueError(f"endpoint {self.endpoint}: plain http is allowed only on loopback; use https:// "
                             "or set allow_http = true")
        if self.sse_kms_key_id and self.sse != "aws:kms":
            raise ValueError('sse_kms_key_id needs sse = "aws:kms"')
        return self

    @property
    def bucket(self) -> str:
        return self.url[len("s3://"):].partition("/")[0]

    @property
    def prefix(self) -> str:
        return self.url[len("s3://"):].partition("/")[2]


class JournalConfig(_Section):
    enabled: bool = Field(True, description="log each dump to journald")


class AnalysisConfig(_Section):
    enabled: bool = Field(True, description="unwind every dump's threads (eu-stack) and compute its signature")
    timeout: Duration(1, 3600) = Field(30.0, description="the analyser is killed after this; the dump is kept")
    max_memory: Size(64 << 20, 1 << 40) = Field(2 << 30, description="address-space limit of the analyser")
    max_threads: int = Field(64, ge=1, le=4096, description="threads kept per dump, the crashing one first")
    max_frames: int = Field(64, ge=1, le=4096, description="frames kept per thread")
    source_lines: bool = Field(False, description="source file:line per frame (eu-stack -s; slow where debug "
                                                  "info is installed)")
    debuginfod_urls: str = Field("", description="debuginfod servers, space-separated, for the debug info of "
                                 "modules without symbols, fetched by the daemon (never the analyser); \"\" = the "
                                 "daemon's DEBUGINFOD_URLS, if set")
    debuginfod_allow_http: bool = Field(False, description="allow plain http:// debuginfod servers that are not on "
                                        "loopback (a debug file steers the unwinder: keep this off)")
    debuginfod_timeout: Duration(0.1, 600) = Field(10.0, description="longest one debuginfod request may take")
    debuginfod_budget: Duration(1, 3600) = Field(30.0, description="longest all debuginfod requests for one dump "
                                                 "may take")
    debuginfod_cache_max: Size(0, units.MAX_SIZE) = Field(2 << 30, description="most the fetched debug files "
                                                          "may use under the state dir (least recently used go)")
    resymbolise_after: Durations(1, 365 * 86400, 16) = Field(
        [3600.0, 21600.0, 86400.0], description="when the daemon looks again for the debug info of a dump whose "
        "trace lacks symbols (debuginfod, a -dbgsym package installed since), each try counted from the one "
        "before; then it stops; [] = never")
    mini_core: bool = Field(True, description="write a mini core beside every stored core (notes, each thread's "
                            "stack, the pages the crashing thread points into), which outlives the full one")
    mini_core_stack: Size(4096, 64 << 20) = Field(64 << 10, description="stack kept per thread in the mini core, "
                                                  "from its stack pointer up")
    mini_core_max: Size(64 << 10, 1 << 30) = Field(32 << 20, description="most bytes of one mini core; threads "
                                                   "past it keep their registers only")
    workers: int = Field(2, ge=1, le=64, description="analyses running at once, each in a thread of the daemon "
                         "beside ingest; one uid's dumps take one at a time")
    uid_budget: Duration(0, 86400) = Field(120.0, description="analysis seconds one uid's dumps may take per "
                                           "uid_window; past it that uid's dumps are stored without analysis "
                                           "(\"analysis skipped: uid budget\"); 0 = no cap")
    uid_window: Duration(1, 86400) = Field(600.0, description="the window uid_budget counts over")

    @model_validator(mode="after")
    def _plain_http(self) -> "AnalysisConfig":
        # A debug file steers the unwinder: over plain http anyone on the path could write it.
        for url in self.debuginfod_urls.split():
            if url.startswith("http://") and not self.debuginfod_allow_http and not loopback_url(url):
                raise ValueError(f"debuginfod_urls: {url}: plain http is allowed only on loopback; use https:// "
                                 "or set debuginfod_allow_http = true")
        return self


class ScrubConfig(_Section):
    enabled: bool = Field(True, description="read every stored dump back in the background and mark those that "
                                            "fail their checksum corrupt (`list`, `status`, the metrics show them)")
    rate: Size(64 << 10, 1 << 40) = Field(4 << 20, description="bytes per second the scrub reads from the store")
    interval: Duration(60, units.MAX_DURATION) = Field(7 * 86400.0, description="from the start of one pass over "
                                                                                "the store to the next")


# What a crash in a pod keeps (corehandler/pods/policy.py): the core, the record only, or nothing.
CORE_KEEPS = ("full", "metadata", "none")
# Kubernetes names: a namespace is a DNS label; a label key an optional DNS subdomain prefix and a name.
_NAMESPACE = re.compile(r"^[a-z0-9]([-a-z0-9]{0,61}[a-z0-9])?$")
_LABEL_KEY = re.compile(r"^(?:[a-z0-9]([-a-z0-9]*[a-z0-9])?(?:\.[a-z0-9]([-a-z0-9]*[a-z0-9])?)*/)?"
                        r"[A-Za-z0-9]([-A-Za-z0-9_.]{0,61}[A-Za-z0-9])?$")
MAX_POD_LABELS = 16


def _namespaces(value) -> list:
    if isinstance(value, list):
        for name in value:
            if not isinstance(name, str) or not _NAMESPACE.match(name):
                raise ValueError(f"{name!r} is not a Kubernetes namespace name")
    return value


def _label_keys(value) -> list:
    if isinstance(value, list):
        if len(value) > MAX_POD_LABELS:
            raise ValueError(f"at most {MAX_POD_LABELS} label keys")
        for key in value:
            if not isinstance(key, str) or len(key) > 317 or not _LABEL_KEY.match(key) \
                    or len(key.rpartition("/")[0]) > 253:
                raise ValueError(f"{key!r} is not a Kubernetes label key")
    return value


Namespaces = Annotated[list[str], BeforeValidator(_namespaces)]


class KubernetesConfig(_Section):
    core: Literal[CORE_KEEPS] = Field("full", description="what a crash in a pod keeps unless its namespace or "
                                      "the pod says otherwise: full (the core), metadata (the record, no core) or "
                                      "none (nothing; counted in corehandler_crashes_excluded_total)")
    full_namespaces: Namespaces = Field([], description="namespaces whose pods' crashes keep the core")
    metadata_namespaces: Namespaces = Field([], description="namespaces whose pods' crashes keep the record only")
    none_namespaces: Namespaces = Field([], description="namespaces whose pods' crashes keep nothing")
    pod_annotation: Literal["narrow", "any", "ignore"] = Field(
        "narrow", description="what a pod's corehandler.io/core annotation (full, metadata, none) may do: narrow = "
        "keep less than its namespace's setting (an opt-out), any = more too (an opt-in), ignore = nothing")
    pod_labels: Annotated[list[str], BeforeValidator(_label_keys)] = Field(
        [], description=f"pod label keys recorded with each crash of a pod (at most {MAX_POD_LABELS}; read from "
        "the Kubernetes API: needs api)")
    api: bool = Field(False, description="ask the Kubernetes API server for the crashed pod's annotations and "
                      "labels (in a pod: its service account's token, allowed to get pods)")

    @model_validator(mode="after")
    def _each_namespace_once(self):
        seen: dict[str, str] = {}
        for keep in CORE_KEEPS:
            for name in getattr(self, f"{keep}_namespaces"):
                if name in seen and seen[name] != keep:
                    raise ValueError(f"namespace {name!r} is in both {seen[name]}_namespaces and {keep}_namespaces")
                seen[name] = keep
        return self


class Config(_Section):
    state_dir: AbsolutePath = Field(DEFAULT_STATE_DIR, description="spool, store and index live here")
    capture: CaptureConfig = CaptureConfig()
    kernel: KernelConfig = KernelConfig()
    compression: CompressionConfig = CompressionConfig()
    retention: RetentionConfig = RetentionConfig()
    metrics: MetricsConfig = MetricsConfig()
    journal: JournalConfig = JournalConfig()
    analysis: AnalysisConfig = AnalysisConfig()
    scrub: ScrubConfig = ScrubConfig()
    upload: UploadConfig = UploadConfig()
    kubernetes: KubernetesConfig = KubernetesConfig()

    def paths(self, base: Paths) -> Paths:
        """base with this config's state_dir."""
        return dataclasses.replace(base, state_dir=self.state_dir)


# --- loading ---------------------------------------------------------------------------------------------

def config_files(paths: Paths) -> list[Path]:
    """The files load_config reads, in order: the main file if present, then the drop-ins by name."""
    try:
        files = [paths.config_file] if paths.config_file.exists() else []
    except OSError as e:
        raise ConfigError(f"{paths.config_file}: cannot read: {e.strerror}", file=str(paths.config_file)) from None
    try:
        dropins = sorted(p for p in paths.dropin_dir.iterdir() if p.name.endswith(".toml"))
    except (FileNotFoundError, NotADirectoryError):
        dropins = []
    except OSError as e:
        raise ConfigError(f"{paths.dropin_dir}: cannot list drop-ins: {e.strerror}",
                          file=str(paths.dropin_dir)) from None
    return files + dropins


def _read_toml(path: Path) -> dict:
    try:
        with open(path, "rb") as f:
            return tomllib.load(f)
    except OSError as e:
        raise ConfigError(f"{path}: cannot read: {e.strerror}", file=str(path)) from None
    except ValueError as e:  # TOMLDecodeError (with line and column) and invalid UTF-8
        raise ConfigError(f"{path}: not valid TOML: {e}", file=str(path)) from None


def _merge(merged: dict, origin: dict, data: dict, file: str) -> None:
    """Lays data over merged section by section, key by key, noting which file each key came from."""
    for key, value in data.items():
        if isinstance(value, dict) and isinstance(merged.get(key), dict):
            merged[key].update(value)
        else:
            merged[key] = dict(value) if isinstance(value, dict) else value
            origin[(key,)] = file
        for sub in value if isinstance(value, dict) else ():
            origin[(key, sub)] = file


def _problem(error: dict, origin: dict, default_file: str) -> tuple[str, str, str, Any]:
    loc = tuple(str(part) for part in error["loc"])
    file = origin.get(loc[:2]) or origin.get(loc[:1]) or default_file
    key = ".".join(loc)
    message = error["msg"].removeprefix("Value error, ")
    if error["type"] == "extra_forbidden":
        message = "unknown option"
    elif error["type"] == "model_type":
        message = "must be a table ([section])"
    if error["type"] == "missing":
        return file, key, message, None
    return file, key, message, error.get("input")


# Keys whose values are never echoed: a secret put in the wrong place (an S3 secret key as an unknown option, a
# token) must not reach logs through the error that refuses it.
_SECRET_KEY_NAME = re.compile(r"secret|password|passwd|token|access_?key|private", re.IGNORECASE)
_SECRET_TEXT = re.compile(r"AGE-SECRET-KEY-|-----BEGIN [A-Z ]*PRIVATE KEY", re.IGNORECASE)


def _echoable(key: str, value: Any) -> bool:
    """Whether an error may show the value set for key: not when the key's name or the value's text suggests a
    secret, nor a URL carrying user:password@."""
    if _SECRET_KEY_NAME.search(key.rsplit(".", 1)[-1]):
        return False
    text = json.dumps(value, default=str)
    return not (_SECRET_TEXT.search(text) or re.search(r"://[^/\s\"]*@", text))


def load_config(paths: Paths) -> Config:
    """The effective config; raises ConfigError naming file, key and value for anything wrong."""
    merged: dict = {}
    origin: dict = {}
    for path in config_files(paths):
        _merge(merged, origin, _read_toml(path), str(path))
    try:
        return Config.model_validate(merged)
    except ValidationError as e:
        problems = [_problem(err, origin, str(paths.config_file)) for err in e.errors()]
        problems = [(file, key, message, value if _echoable(key, value) else None)
                    for file, key, message, value in problems]
        lines = [f"{file}: {key}" + (f" = {toml_value(value)}" if value is not None else "") + f": {message}"
                 for file, key, message, value in problems]
        file, key, _, value = problems[0]
        raise ConfigError("; ".join(lines), file=file, key=key, value=value) from None


# --- TOML values, for error messages and the files that show a config (configtext.py) -------------------

def toml_value(value: Any) -> str:
    if isinstance(value, bool):
        return "true" if value else "false"
    if isinstance(value, (int, float)):
        return repr(value)
    if isinstance(value, (list, tuple)):
        return "[" + ", ".join(toml_value(v) for v in value) + "]"
    if isinstance(value, dict):
        return "{" + ", ".join(f"{json.dumps(str(k))} = {toml_value(v)}" for k, v in value.items()) + "}"
    # A TOML basic string: JSON's escapes, minus the surrogate pairs and raw DEL that TOML refuses.
    text = json.dumps(str(value), ensure_ascii=False)
    return text.replace("\x7f", "\\u007f")

"""The fleet view: every host's dumps, read from the bucket's sidecars (no database server of our own).

A sidecar exists only once its core is verified, so everything listed here can be fetched. Listing is one
prefix listing per host and day plus one GET per sidecar not yet in the local cache, the GETs in a bounded
pool of threads: O(dumps) the first time, O(new dumps) after. The cache (SQLite, 0600: sidecars hold
command lines) keys each sidecar by its key and ETag, so a rewritten one is read again. Past ~10^5 dumps a
day, per-day summary objects or the storage's inventory service would be the way (docs/design.md, "Fleet").
"""

from __future__ import annotations

import datetime
import hashlib
import json
import os
import sqlite3
import tempfile
from concurrent.futures import ThreadPoolExecutor
from pathlib import Path
from typing import BinaryIO, Callable, Iterable

from corehandler import paths
from corehandler.errors import CorehandlerError, NoMatchError
from corehandler.fleet import bucket
from corehandler.fleet.bucket import BucketError, Target
from corehandler.store import compress

WORKERS = 32
CHUNK = 8 << 20


class FleetCorruptError(CorehandlerError):
    """An object in the bucket does not match its sidecar."""


def _call(fn, *args, **kwargs):
    try:
        return fn(*args, **kwargs)
    except CorehandlerError:
        raise
    except Exception as e:
        raise bucket.classify(e) from e


def hosts(client, target: Target) -> list[str]:
    """The hosts with objects under the prefix."""
    found = []
    pages = client.get_paginator("list_objects_v2").paginate(Bucket=target.bucket, Prefix=target.root(),
                                                             Delimiter="/")
    for page in _call(lambda: list(pages)):
        for p in page.get("CommonPrefixes") or []:
            name = p["Prefix"][len(target.root()):].rstrip("/")
            if name and name != bucket.BUDGET:
                found.append(name)
    return sorted(found)


def sidecar_keys(client, target: Target, host: str, day: datetime.date) -> list[tuple[str, str]]:
    """(key, ETag) of every sidecar of a host's day."""
    pages = client.get_paginator("list_objects_v2").paginate(Bucket=target.bucket,
                                                             Prefix=target.day_prefix(host, day))
    return [(o["Key"], o.get("ETag", "")) for page in _call(lambda: list(pages)) for o in page.get("Contents") or []
            if o["Key"].endswith(bucket.SIDECAR_SUFFIX)]


def read_sidecar(client, target: Target, key: str) -> dict:
    return _parse(target, key, _call(client.get_object, Bucket=target.bucket, Key=key)["Body"].read())


def _parse(target: Target, key: str, body: bytes | str) -> dict:
    try:
        data = json.loads(body)
    except ValueError as e:
        raise FleetCorruptError(f"s3://{target.bucket}/{key} is not a JSON sidecar: {e}") from None
    data["_key"] = key
    return data


def _cache_name(target: Target, endpoint: str) -> str:
    return hashlib.sha256(f"{endpoint}\0{target.bucket}\0{target.prefix}".encode()).hexdigest()[:16]


class SidecarCache:
    """Sidecars already read, by key and ETag, in a private SQLite file."""

    def __init__(self, path: Path):
        self.path = Path(path)
        self.path.parent.mkdir(mode=0o700, parents=True, exist_ok=True)
        fd = os.open(self.path, os.O_RDWR | os.O_CREAT | os.O_NOFOLLOW | os.O_CLOEXEC, 0o600)
        os.close(fd)
        self.db = sqlite3.connect(self.path, timeout=10)
        self.db.execute("CREATE TABLE IF NOT EXISTS sidecars (key TEXT PRIMARY KEY, etag TEXT NOT NULL, "
                        "body TEXT NOT NULL)")

    @staticmethod
    def default_path(target: Target, endpoint: str, state_dir: Path | None = None) -> Path:
        """~/.cache/corehandler (or XDG_CACHE_HOME's); as root the state dir's cache/ instead: `sudo` may keep
        the invoking user's HOME and XDG_CACHE_HOME, where a file or symlink of theirs would take root's
        writes."""
        if os.geteuid() == 0 and state_dir is not None:
            return paths.cache_dir(state_dir) / f"fleet-{_cache_name(target, endpoint)}.sqlite"
        base = Path(os.environ.get("XDG_CACHE_HOME") or Path.home() / ".cache")
        return base / "corehandler" / f"fleet-{_cache_name(target, endpoint)}.sqlite"


    def get(self, keys: list[str]) -> dict[str, tuple[str, str]]:
        found = {}
        for i in range(0, len(keys), 500):
            chunk = keys[i:i + 500]
            marks = ",".join("?" * len(chunk))
            found.update((k, (e, b)) for k, e, b in
                         self.db.execute(f"SELECT key, etag, body FROM sidecars WHERE key IN ({marks})", chunk))
        return found

    def put(self, rows: list[tuple[str, str, str]]) -> None:
        with self.db:
            self.db.executemany("INSERT OR REPLACE INTO sidecars (key, etag, body) VALUES (?, ?, ?)", rows)

    def close(self) -> None:
        self.db.close()


def list_sidecars(client, target: Target, days: Iterable[datetime.date], only_hosts: Iterable[str] = (),
                  workers: int = WORKERS, cache: SidecarCache | None = None) -> list[dict]:
    """Every sidecar of those days (and hosts, if given), oldest first."""
    names = list(only_hosts) or hosts(client, target)
    pairs = [(h, d) for h in names for d in days]
    with ThreadPoolExecutor(max_workers=workers) as pool:
        listed = [k for ks in pool.map(lambda hd: sidecar_keys(client, target, *hd), pairs) for k in ks]
        cached = cache.get([k for k, _ in listed]) if cache else {}
        fresh = [(k, e) for k, e in listed if cached.get(k, ("",))[0] != e or not e]

        def fetch(key_etag):
            key, etag = key_etag
            return key, etag, _call(client.get_object, Bucket=target.bucket, Key=key)["Body"].read().decode()
        got = list(pool.map(fetch, fresh))
    if cache and got:
        cache.put(got)
    bodies = {k: b for k, (_, b) in cached.items()}
    bodies.update((k, b) for k, _, b in got)
    sidecars = [_parse(target, k, bodies[k]) for k, _ in listed]
    return sorted(sidecars, key=lambda s: (s.get("crashed_at") or 0, s.get("id") or ""))


def row(sc: dict) -> dict:
    """A sidecar's list row."""
    index = sc.get("index") or {}
    core = sc.get("core")
    return {"id": sc.get("id"), "host": sc.get("host"), "crashed_at": sc.get("crashed_at"),
            "exe": index.get("exe"), "comm": index.get("comm"), "signal": index.get("signal"),
            "status": index.get("status"), "signature": sc.get("signature"),
            "core": core is not None, "core_bytes": core["bytes"] if core else None,
            "raw_bytes": index.get("raw_bytes"), "budget": sc.get("budget"), "key": sc.get("_key")}


def group(sidecars: Iterable[dict]) -> list[dict]:
    """One row per signature: count, cores, hosts, first and last seen; most frequent first."""
    groups: dict[str, dict] = {}
    for sc in sidecars:
        r = row(sc)
        g = groups.setdefault(r["signature"], {"signature": r["signature"], "count": 0, "cores": 0, "hosts": set(),
                                               "first_seen": r["crashed_at"], "last_seen": r["crashed_at"],
                                               "exe": r["exe"], "signal": r["signal"], "latest": r["id"]})
        g["count"] += 1
        g["cores"] += r["core"]
        g["hosts"].add(r["host"])
        if r["crashed_at"] is not None:
            if g["first_seen"] is None or r["crashed_at"] < g["first_seen"]:
                g["first_seen"] = r["crashed_at"]
            if g["last_seen"] is None or r["crashed_at"] >= g["last_seen"]:
                g["last_seen"], g["latest"] = r["crashed_at"], r["id"]
    out = [dict(g, hosts=sorted(g["hosts"])) for g in groups.values()]
    return sorted(out, key=lambda g: (-g["count"], g["signature"] or ""))


def find(client, target: Target, dump_id: str, host: str | None = None) -> dict:
    """The sidecar of a dump, by its id (the id carries its crash day) on any host or the one given."""
    day = bucket.id_day(dump_id)
    if day is None:
        raise NoMatchError(f"{dump_id!r} is not a dump id (<µs>-<boot id>-<pid>)")
    names = [host] if host else hosts(client, target)

    def probe(h: str) -> dict | None:
        from botocore.exceptions import ClientError

        key = target.day_prefix(h, day) + dump_id + bucket.SIDECAR_SUFFIX
        try:
            return read_sidecar(client, target, key)
        except BucketError as e:
            cause = e.__cause__ or e.__context__
            if isinstance(cause, ClientError) and cause.response.get("Error", {}).get("Code") in ("NoSuchKey", "404"):
                return None
            raise

    with ThreadPoolExecutor(max_workers=WORKERS) as pool:
        found = [s for s in pool.map(probe, names) if s]
    if not found:
        raise NoMatchError(f"no dump {dump_id} in s3://{target.bucket}/{target.root()}")
    if len(found) > 1:
        raise NoMatchError(f"{dump_id} exists on several hosts ({', '.join(s['host'] for s in found)}): "
                           "say which with --host")
    return found[0]


def fetch_core(client, target: Target, sc: dict, *, output: BinaryIO, progress: Callable[[int], None] | None = None,
               workdir: Path | None = None) -> int:
    """Downloads the dump's core into a private temp file, checks its SHA-256 against the sidecar's, then
    writes it decompressed to output and checks the original bytes' size and SHA-256. Returns the size.
    progress(n) hears of the bytes downloaded, then of those decompressed."""
    core = sc.get("core")
    if not core:
        raise NoMatchError(f"{sc.get('id')} has no core in the bucket (budget: {sc.get('budget')}, "
                           f"upload.send: metadata?); its sidecar is all there is")
    suffix = ".zst" if core.get("compression") == "zstd" else ".core"
    fd, tmp = tempfile.mkstemp(prefix=".corehandler-fleet-", suffix=suffix, dir=workdir)
    try:
        digest = hashlib.sha256()
        with os.fdopen(fd, "wb") as f:
            resp = _call(client.get_object, Bucket=target.bucket, Key=core["key"])
            for chunk in resp["Body"].iter_chunks(CHUNK):
                digest.update(chunk)
                f.write(chunk)
                if progress:
                    progress(len(chunk))
        if digest.hexdigest() != core.get("object_sha256"):
            raise FleetCorruptError(f"s3://{target.bucket}/{core['key']} has sha256 {digest.hexdigest()}, its "
                                    f"sidecar says {core.get('object_sha256')}: the object is corrupt")
        try:
            size, raw = compress.decompress_to(Path(tmp), output, progress)
        except compress.VerifyError as e:
            raise FleetCorruptError(f"s3://{target.bucket}/{core['key']}: {e}") from None
        if size != core.get("raw_bytes") or (core.get("raw_sha256") and raw != core["raw_sha256"]):
            raise FleetCorruptError(f"s3://{target.bucket}/{core['key']} decompresses to {size} bytes with sha256 "
                                    f"{raw}, its sidecar says {core.get('raw_bytes')} with {core.get('raw_sha256')}")
        return size
    finally:
        os.unlink(tmp)


def fetch_mini(client, target: Target, sc: dict, *, output: BinaryIO) -> int:
    """Downloads the dump's mini core (uploaded for every dump), checked against the sidecar's SHA-256."""
    mini = sc.get("mini")
    if not mini:
        raise NoMatchError(f"{sc.get('id')} has no mini core in the bucket (uploaded before mini cores existed, "
                           "or upload.send: metadata)")
    data = _call(client.get_object, Bucket=target.bucket, Key=mini["key"])["Body"].read()
    if hashlib.sha256(data).hexdigest() != mini.get("sha256"):
        raise FleetCorruptError(f"s3://{target.bucket}/{mini['key']} does not have the sha256 its sidecar says: "
                                "the object is corrupt")
    output.write(data)
    return len(data)

"""The reading side of the bucket's sidecars: finding one, listing those the index does not cover (v1 hosts,
a host's day without an index file), fetching a core, and the local cache of what was read.

A sidecar exists only once its core is verified, so everything listed here can be fetched. Listing is one
prefix listing per host and day plus one GET per sidecar not yet in the local cache, the GETs in a bounded
pool of threads: O(dumps) the first time, O(new dumps) after. The cache (SQLite, 0600: sidecars hold
command lines) keys each sidecar by its key and ETag, so a rewritten one is read again; beside it, the
Parquet index files the fleet view reads (fleetview.py).

A sidecar is another host's word: read only up to MAX_SIDECAR_BYTES, one that is not UTF-8, not JSON (bounded
in nesting, boundedjson.py) or of a newer schema is skipped, its key named; its host is the one its key names,
whatever it says; the core and mini core it names are fetched only at its own key's folder and id, and a
core is decompressed only up to the raw_bytes it claims.
"""

from __future__ import annotations

import datetime
import hashlib
import os
import sqlite3
import tempfile
from concurrent.futures import ThreadPoolExecutor
from pathlib import Path
from typing import BinaryIO, Callable, Iterable

from corehandler import boundedjson, paths
from corehandler.analysis import minicore
from corehandler.errors import CorehandlerError, NoMatchError
from corehandler.fleet import bucket, dataset, seal, withoutcore
from corehandler.fleet.bucket import BucketError, Target
from corehandler.fleet.payload import SIDECAR_SCHEMA, Digester
from corehandler.store import compress

WORKERS = 32
CHUNK = 8 << 20
MAX_SIDECAR_BYTES = 16 << 20   # a sidecar with every thread's frames is a few hundred KiB
MAX_MINI_BYTES = 256 << 20
CORE_SUFFIXES = (".zst", ".core", ".zst" + seal.SUFFIX, ".core" + seal.SUFFIX)
MINI_SUFFIXES = (minicore.SUFFIX, minicore.SUFFIX + seal.SUFFIX)


class FleetCorruptError(CorehandlerError):
    """An object in the bucket does not match its sidecar."""


def _call(fn, *args, **kwargs):
    try:
        return fn(*args, **kwargs)
    except CorehandlerError:
        raise
    except Exception as e:
        raise bucket.classify(e) from e


def _prefixes(client, target: Target, prefix: str) -> list[str]:
    """The next path segment of every key under prefix (one listing with a delimiter)."""
    pages = client.get_paginator("list_objects_v2").paginate(Bucket=target.bucket, Prefix=prefix, Delimiter="/")
    return [p["Prefix"][len(prefix):].rstrip("/") for page in _call(lambda: list(pages))
            for p in page.get("CommonPrefixes") or []]


def hosts(client, target: Target) -> list[str]:
    """The hosts of the v1 layout (corehandler 0.2) under the prefix."""
    return sorted(n for n in _prefixes(client, target, target.root(bucket.V1)) if n and n != bucket.BUDGET)


def day_hosts(client, target: Target, day: datetime.date) -> list[str]:
    """The hosts with v2 objects of that day."""
    return sorted(n[len("host="):] for n in _prefixes(client, target, target.root() + f"dt={day:%Y-%m-%d}/")
                  if n.startswith("host="))


def list_keys(client, target: Target, prefix: str, suffix: str = bucket.SIDECAR_SUFFIX,
              direct: bool = False) -> list[tuple[str, str]]:
    """(key, ETag) of every object under prefix whose name ends with suffix; with direct, only those right in
    prefix, not in a folder under it (where a key of another host's making may pass for a host's)."""
    pages = client.get_paginator("list_objects_v2").paginate(Bucket=target.bucket, Prefix=prefix)
    return [(o["Key"], o.get("ETag", "")) for page in _call(lambda: list(pages)) for o in page.get("Contents") or []
            if o["Key"].endswith(suffix) and not (direct and "/" in o["Key"][len(prefix):])]


def sidecar_keys(client, target: Target, host: str, day: datetime.date) -> list[tuple[str, str]]:
    """(key, ETag) of every sidecar of a host's day, in either layout."""
    return list_keys(client, target, target.day_prefix(host, day), direct=True) + \
        list_keys(client, target, target.v1_day_prefix(host, day), direct=True)


class CoreMissingError(NoMatchError):
    """A core (or mini core) its sidecar names is gone from the bucket: deleted by hand or by a lifecycle rule
    after it was uploaded and verified (a sidecar is written only then)."""


def not_found(e: BaseException) -> bool:
    """Whether a bucket request failed because the object is not there (not for want of the bucket)."""
    from botocore.exceptions import ClientError

    cause = e if isinstance(e, ClientError) else e.__cause__ or e.__context__
    return isinstance(cause, ClientError) and cause.response.get("Error", {}).get("Code") in ("NoSuchKey", "404",
                                                                                             "NotFound")


def missing_cores(client, target: Target, rows: list[dict], workers: int = WORKERS) -> set[str]:
    """The sidecar keys, of those rows (with `key`, `core`, `core_key`), whose core is not in the bucket: one
    listing of each sidecar's folder (a host's day: its sidecars, cores and mini cores) that holds a row with a
    core, in a pool of threads, not a HEAD per row. A core_key outside its sidecar's folder counts as
    missing (`fleet get` fetches a sidecar's own core only)."""
    folders: dict[str, list[dict]] = {}
    for r in rows:
        if r.get("core") and isinstance(r.get("key"), str):
            folders.setdefault(r["key"].rpartition("/")[0] + "/", []).append(r)
    with ThreadPoolExecutor(max_workers=workers) as pool:
        listed = dict(zip(folders, pool.map(lambda f: {k for k, _ in list_keys(client, target, f, "", direct=True)},
                                            folders)))
    return {r["key"] for folder, held in folders.items() for r in held if r.get("core_key") not in listed[folder]}


def core_missing(client, target: Target, r: dict) -> bool:
    """Whether one row's core (reader.row) is gone from the bucket: one HEAD."""
    if not r.get("core") or not isinstance(r.get("core_key"), str):
        return False
    try:
        _call(client.head_object, Bucket=target.bucket, Key=r["core_key"])
    except BucketError as e:
        if not_found(e):
            return True
        raise
    return False


class SkippedSidecar(FleetCorruptError):
    """A sidecar this corehandler cannot read (too big, not UTF-8, not JSON, a newer schema): named and
    skipped by listings."""


def _get_sidecar(client, target: Target, key: str) -> bytes:
    try:
        return _call(bucket.read_bounded, client, target.bucket, key, MAX_SIDECAR_BYTES)
    except bucket.ObjectTooLarge as e:
        raise SkippedSidecar(e.message) from None


def read_sidecar(client, target: Target, key: str) -> dict:
    return _parse(target, key, _get_sidecar(client, target, key))


def key_host(target: Target, key: str) -> str | None:
    """The host a sidecar's key names (v2: its host= segment; v1: the segment after v1/), by pattern."""
    v1 = target.root(bucket.V1)
    if key.startswith(v1):
        return bucket.safe_host(key[len(v1):].split("/", 1)[0])
    return bucket.host_of(key)


def _parse(target: Target, key: str, body: bytes | str) -> dict:
    where = f"s3://{target.bucket}/{key}"
    if isinstance(body, bytes):
        try:
            body = body.decode("utf-8")
        except UnicodeDecodeError as e:
            raise SkippedSidecar(f"{where} is not a JSON sidecar: not UTF-8 ({e.reason} at byte {e.start})") from None
    try:
        data = boundedjson.loads(body, max_bytes=MAX_SIDECAR_BYTES)
    except boundedjson.BoundedJSONError as e:
        raise SkippedSidecar(f"{where} is not a JSON sidecar: {e}") from None
    if not isinstance(data, dict):
        raise SkippedSidecar(f"{where} is not a JSON sidecar: not an object")
    schema = data.get("schema")
    if not isinstance(schema, int) or schema > SIDECAR_SCHEMA:
        raise SkippedSidecar(f"{where} has sidecar schema {schema!r}, newer than this corehandler's "
                             f"({SIDECAR_SCHEMA})")
    host = key_host(target, key)
    if host is None:
        raise SkippedSidecar(f"{where} is not under a host's prefix")
    data["host"] = host
    data["_key"] = key
    return data


def _cache_name(target: Target, endpoint: str) -> str:
    return hashlib.sha256(f"{endpoint}\0{target.bucket}\0{target.prefix}".encode()).hexdigest()[:16]


class SidecarCache:
    """Sidecars already read, by key and ETag, in a private SQLite file; beside it, the index files already
    downloaded (parts_dir), by key and ETag too with their schema check's outcome, and the fleet view's
    files merged from them (fleetview.py)."""

    def __init__(self, path: Path):
        self.path = Path(path)
        self.path.parent.mkdir(mode=0o700, parents=True, exist_ok=True)
        fd = os.open(self.path, os.O_RDWR | os.O_CREAT | os.O_NOFOLLOW | os.O_CLOEXEC, 0o600)
        os.close(fd)
        self.parts_dir = self.path.with_suffix(".parts")
        self.parts_dir.mkdir(mode=0o700, exist_ok=True)
        self.db = sqlite3.connect(self.path, timeout=10)
        self.db.execute("CREATE TABLE IF NOT EXISTS sidecars (key TEXT PRIMARY KEY, etag TEXT NOT NULL, "
                        "body TEXT NOT NULL)")
        self.db.execute("CREATE TABLE IF NOT EXISTS parts (key TEXT PRIMARY KEY, etag TEXT NOT NULL)")
        # The outcome of the file's check, by the index schema of the corehandler that checked it (a newer
        # one reads files an older one skipped); a cache of before they were kept has NULLs: checked again.
        have = {r[1] for r in self.db.execute("PRAGMA table_info(parts)")}
        for column in ("checked_schema INTEGER", "problem TEXT"):
            if column.split()[0] not in have:
                self.db.execute(f"ALTER TABLE parts ADD COLUMN {column}")

    @staticmethod
    def default_path(target: Target, endpoint: str, state_dir: Path | None = None) -> Path:
        """~/.cache/corehandler (or XDG_CACHE_HOME's); as root the state dir's cache/ instead: `sudo` may keep
        the invoking user's HOME and XDG_CACHE_HOME, where a file or symlink of theirs would take root's
        writes."""
        if os.geteuid() == 0 and state_dir is not None:
            return paths.cache_dir(state_dir) / f"fleet-{_cache_name(target, endpoint)}.sqlite"
        base = Path(os.environ.get("XDG_CACHE_HOME") or Path.home() / ".cache")
        return base / "corehandler" / f"fleet-{_cache_name(target, endpoint)}.sqlite"


    def _lookup(self, sql: str, keys: list[str]) -> list[tuple]:
        found = []
        for i in range(0, len(keys), 500):
            chunk = keys[i:i + 500]
            found += self.db.execute(sql.format(marks=",".join("?" * len(chunk))), chunk).fetchall()
        return found

    def get(self, keys: list[str]) -> dict[str, tuple[str, str]]:
        return {k: (e, b) for k, e, b in self._lookup("SELECT key, etag, body FROM sidecars WHERE key IN ({marks})",
                                                      keys)}

    def put(self, rows: list[tuple[str, str, str]]) -> None:
        with self.db:
            self.db.executemany("INSERT OR REPLACE INTO sidecars (key, etag, body) VALUES (?, ?, ?)", rows)

    def parts(self, keys: list[str]) -> dict[str, tuple[str, int | None, str | None]]:
        """The index files held, by key: (ETag, the index schema it was checked by, why it is left out: ""
        for no reason), the last two None where it was not checked."""
        return {k: (e, c, p) for k, e, c, p in self._lookup(
            "SELECT key, etag, checked_schema, problem FROM parts WHERE key IN ({marks})", keys)}

    def put_parts(self, rows: list[tuple[str, str, int, str]]) -> None:
        """(key, ETag, the index schema it was checked by, why it is left out or "")."""
        with self.db:
            self.db.executemany("INSERT OR REPLACE INTO parts (key, etag, checked_schema, problem) "
                                "VALUES (?, ?, ?, ?)", rows)

    def close(self) -> None:
        self.db.close()


def read_sidecars(client, target: Target, listed: list[tuple[str, str]], workers: int = WORKERS,
                  cache: SidecarCache | None = None) -> tuple[list[dict], list[str]]:
    """The sidecars of those (key, ETag)s, oldest first, and why each unreadable one was skipped. Only those
    the cache does not hold at that ETag are read (in a pool of threads)."""
    cached = cache.get([k for k, _ in listed]) if cache else {}
    fresh = [(k, e) for k, e in listed if cached.get(k, ("",))[0] != e or not e]

    def fetch(key_etag):
        key, etag = key_etag
        try:
            body = _get_sidecar(client, target, key)
            return key, etag, body.decode("utf-8"), None
        except SkippedSidecar as e:
            return key, etag, None, e.message
        except UnicodeDecodeError:
            return key, etag, body, None  # _parse names it; not cached (the cache holds text)
    with ThreadPoolExecutor(max_workers=workers) as pool:
        got = list(pool.map(fetch, fresh))
    if cache and got:
        cache.put([(k, e, b) for k, e, b, _ in got if isinstance(b, str)])
    bodies = {k: b for k, (_, b) in cached.items()}
    bodies.update((k, b) for k, _, b, _ in got)
    problems = {k: p for k, _, _, p in got if p}
    sidecars, skipped = [], []
    for k, _ in listed:
        try:
            if k in problems:
                raise SkippedSidecar(problems[k])
            sidecars.append(_parse(target, k, bodies[k]))
        except SkippedSidecar as e:
            skipped.append(e.message)
    return sorted(sidecars, key=lambda s: (_number(s.get("crashed_at")), str(s.get("id")))), skipped


def _number(value) -> float:
    return float(value) if isinstance(value, (int, float)) and not isinstance(value, bool) else 0.0


def list_sidecars(client, target: Target, days: Iterable[datetime.date], only_hosts: Iterable[str] = (),
                  workers: int = WORKERS, cache: SidecarCache | None = None) -> tuple[list[dict], list[str]]:
    """Every sidecar of those days (and hosts, if given) in both layouts, oldest first, and the skipped."""
    days = list(days)
    names = list(only_hosts) or sorted(set(hosts(client, target)).union(
        *(day_hosts(client, target, d) for d in days)))
    pairs = [(h, d) for h in names for d in days]
    with ThreadPoolExecutor(max_workers=workers) as pool:
        listed = [k for ks in pool.map(lambda hd: sidecar_keys(client, target, *hd), pairs) for k in ks]
    return read_sidecars(client, target, listed, workers, cache)


def row(sc: dict) -> dict:
    """A sidecar's list row, each value of its index column's type or None (dataset.row)."""
    r = dataset.row(sc, sc.get("_key"))
    return {"id": r["id"], "host": sc.get("host"), "crashed_at": r["crashed_at"].timestamp() if r["crashed_at"]
            else None, "exe": r["exe"], "comm": r["comm"], "signal": r["signal"], "status": r["status"],
            "signature": r["signature"], "signature_id": r["signature_id"], "signature_v1_id": r["signature_v1_id"],
            "core": r["has_core"], "core_key": r["core_key"], "core_bytes": r["core_bytes"],
            "raw_bytes": r["raw_bytes"], "budget": r["budget"], "no_core_reason": r["no_core_reason"],
            "no_core_why": r["no_core_why"], "key": sc.get("_key")}


def find(client, target: Target, dump_id: str, host: str | None = None) -> dict:
    """The sidecar of a dump, by its id (the id carries its crash day) on any host or the one given, in
    either layout."""
    day = bucket.id_day(dump_id)
    if day is None:
        raise NoMatchError(f"{dump_id!r} is not a dump id (<µs>-<boot id>-<pid>)")
    v2, v1 = ([host], [host]) if host else (day_hosts(client, target, day), hosts(client, target))
    keys = [target.day_prefix(h, day) + dump_id + bucket.SIDECAR_SUFFIX for h in v2] + \
        [target.v1_day_prefix(h, day) + dump_id + bucket.SIDECAR_SUFFIX for h in v1]

    def probe(key: str) -> dict | None:
        try:
            return read_sidecar(client, target, key)
        except BucketError as e:
            if not_found(e):
                return None
            raise

    with ThreadPoolExecutor(max_workers=WORKERS) as pool:
        found = [s for s in pool.map(probe, keys) if s]
    if not found:
        raise NoMatchError(f"no dump {dump_id} in s3://{target.bucket}/{target.prefix}")
    if len(found) > 1:
        raise NoMatchError(f"{dump_id} exists on several hosts ({', '.join(s['host'] for s in found)}): "
                           "say which with --host")
    return found[0]


def fetch_core(client, target: Target, sc: dict, *, output: BinaryIO, progress: Callable[[int], None] | None = None,
               workdir: Path | None = None, identities: list | None = None) -> int:
    """Downloads the dump's core into a private temp file and checks its SHA-256 against the sidecar's; an
    encrypted core is then decrypted with `identities` into a second one; last it is written decompressed to
    output, checking the original bytes' size and SHA-256. Returns the size. progress(n) hears of the bytes
    downloaded, then of those decompressed."""
    core = sc.get("core")
    if core and not isinstance(core, dict):
        raise FleetCorruptError(f"{sc['_key']} gives its core as {type(core).__name__}, not an object")
    if not core:
        why = withoutcore.of_sidecar(sc) or {}
        raise NoMatchError(f"{sc.get('id')} has no core in the bucket: {why.get('why')} (no_core_reason "
                           f"{why.get('reason')}); its sidecar is all there is, and its mini core if it has one "
                           "(fleet get --mini)")
    where = f"s3://{target.bucket}/{core.get('key')}"
    _check_own(sc, core.get("key"), CORE_SUFFIXES, "core")
    raw_bytes = core.get("raw_bytes")
    if not isinstance(raw_bytes, int) or isinstance(raw_bytes, bool) or raw_bytes < 0:
        raise FleetCorruptError(f"{sc['_key']} gives its core no size (raw_bytes {raw_bytes!r}): not fetched")
    encrypted = core.get("encryption") == "age"
    if encrypted and not identities:
        recipients = core.get("recipients")
        raise seal.IdentityError(f"{where} is encrypted (age, to "
                                 f"{', '.join(map(str, recipients)) if isinstance(recipients, list) else '?'}): "
                                 "pass --identity FILE")
    suffix = ".zst" if core.get("compression") == "zstd" else ".core"
    temps = []
    try:
        temps.append(_temp(workdir, suffix))
        part_size = core.get("part_size")
        digester = Digester(part_size if isinstance(part_size, int) and part_size > 0 else 1 << 62)
        size = core.get("bytes")
        if not isinstance(size, int) or size < 0:
            raise FleetCorruptError(f"{sc['_key']} gives its core no size (bytes {size!r}): not fetched")

        def seen(chunk: bytes) -> None:
            digester.update(chunk)
            if progress:
                progress(len(chunk))
        with open(temps[-1], "wb") as f:
            try:  # the object is the size its sidecar says, or it is not downloaded past that
                _call(bucket.download_to, client, target.bucket, core["key"], f, size, chunk=CHUNK, each=seen)
            except bucket.ObjectTooLarge as e:
                raise FleetCorruptError(f"{e.message}: its sidecar says {size}") from None
            except BucketError as e:
                if not_found(e):
                    raise _gone("core", where, target, sc) from None
                raise
        got = digester.result()
        # Sidecars of 0.2 carry the full SHA-256 only; later ones the S3 checksum and its part size.
        want = core.get("checksum") or core.get("object_sha256")
        if not isinstance(want, str):
            raise FleetCorruptError(f"{sc['_key']} gives its core no checksum: not trusted")
        have = got.sha256 if "checksum" not in core else got.composite_b64 if "-" in want else got.full_b64
        if have != want:
            raise FleetCorruptError(f"{where} has checksum {have}, its sidecar says {want}: the object is corrupt")
        if encrypted:
            temps.append(_temp(workdir, suffix))
            with open(temps[-1], "wb") as f:
                seal.decrypt_file(temps[0], f, identities, what=where)
        try:
            size, raw = compress.decompress_to(temps[-1], output, progress, limit=raw_bytes)
        except compress.VerifyError as e:
            raise FleetCorruptError(f"{where}: {e}") from None
        if size != core.get("raw_bytes") or (core.get("raw_sha256") and raw != core["raw_sha256"]):
            raise FleetCorruptError(f"{where} decompresses to {size} bytes with sha256 "
                                    f"{raw}, its sidecar says {core.get('raw_bytes')} with {core.get('raw_sha256')}")
        return size
    finally:
        for tmp in temps:
            os.unlink(tmp)


def _gone(what: str, where: str, target: Target, sc: dict) -> CoreMissingError:
    return CoreMissingError(f"{what} missing from the bucket: {where} is gone, though its sidecar "
                            f"s3://{target.bucket}/{sc['_key']} says it was uploaded and verified (deleted by hand "
                            "or by a lifecycle rule since)")


def _check_own(sc: dict, key, suffixes: tuple[str, ...], what: str) -> None:
    """A sidecar may name only its own dump's objects: beside it, named by the id its own key carries."""
    folder, _, name = sc["_key"].rpartition("/")
    dump_id = name[:-len(bucket.SIDECAR_SUFFIX)]
    if key not in {f"{folder}/{dump_id}{suffix}" for suffix in suffixes}:
        raise FleetCorruptError(f"{sc['_key']} names {what} {key!r}, not its own dump's "
                                f"({folder}/{dump_id}{suffixes[0]}...): not fetched")


def _temp(workdir: Path | None, suffix: str) -> Path:
    fd, tmp = tempfile.mkstemp(prefix=".corehandler-fleet-", suffix=suffix, dir=workdir)
    os.close(fd)
    return Path(tmp)


def fetch_mini(client, target: Target, sc: dict, *, output: BinaryIO, identities: list | None = None) -> int:
    """Downloads the dump's mini core (uploaded for every dump), checked against the sidecar's SHA-256 of the
    object, then decrypted with `identities` when it went up encrypted."""
    mini = sc.get("mini")
    if mini and not isinstance(mini, dict):
        raise FleetCorruptError(f"{sc['_key']} gives its mini core as {type(mini).__name__}, not an object")
    if not mini:
        raise NoMatchError(f"{sc.get('id')} has no mini core in the bucket (uploaded before mini cores existed, "
                           "or upload.send: metadata)")
    where = f"s3://{target.bucket}/{mini.get('key')}"
    _check_own(sc, mini.get("key"), MINI_SUFFIXES, "mini core")
    if mini.get("encryption") == "age" and not identities:
        raise seal.IdentityError(f"{where} is encrypted (age): pass --identity FILE")
    try:
        data = _call(bucket.read_bounded, client, target.bucket, mini["key"], MAX_MINI_BYTES)
    except bucket.ObjectTooLarge as e:
        raise FleetCorruptError(e.message) from None
    except BucketError as e:
        if not_found(e):
            raise _gone("mini core", where, target, sc) from None
        raise
    if hashlib.sha256(data).hexdigest() != mini.get("sha256"):
        raise FleetCorruptError(f"{where} does not have the sha256 its sidecar says: the object is corrupt")
    if mini.get("encryption") == "age":
        data = seal.decrypt_bytes(data, identities, what=where)
    output.write(data)
    return len(data)

"""Debug info by build-id from debuginfod servers, fetched by the daemon (or `corehandler analyze`), never by
the sandboxed analyser, which has no network: it only reads the cache this fills.

The cache is `<state>/debuginfo/.build-id/xx/rest.debug`, the separate-debuginfo layout elfutils searches by
build-id under each absolute directory of its debuginfo path (eu-stack `--debuginfo-path`, search_path()); the
debuginfod client library itself is not used (it would need the network and a writable cache in the sandbox).

Bounded every way: a per-request timeout (the socket's, and the whole body's), a time budget per dump, a size cap
per file and for the whole cache (oldest used first out), negative results (404 from every server) remembered
for `negative_ttl`, a server that is down remembered for nothing (the next dump asks again). What is fetched is
an ELF file or nothing: a server's answer is written to a temp file, checked, and renamed into place.
"""

from __future__ import annotations

import dataclasses
import logging
import os
import queue
import re
import threading
import time
import urllib.error
import urllib.request
from dataclasses import dataclass, field
from pathlib import Path

from corehandler import elfcore
from corehandler.analysis import findings

log = logging.getLogger(__name__)

CACHE_DIR = "debuginfo"
_BUILD_ID = re.compile(r"[0-9a-f]{8,128}")
_CHUNK = 1 << 20


@dataclass(frozen=True)
class Settings:
    urls: tuple[str, ...] = ()
    timeout: float = 10.0          # one request, the body included
    budget: float = 30.0           # every request for one dump
    cache_max: int = 2 << 30       # the whole cache; oldest used first out
    file_max: int = 1 << 30        # one debug file
    negative_ttl: float = 3600.0   # a build-id no server has is not asked again for this long
    # When the daemon looks again for what a trace lacks (resymbolise.py), each counted from the try before.
    retry_after: tuple[float, ...] = (3600.0, 21600.0, 86400.0)


@dataclass
class Report:
    fetched: list[str] = field(default_factory=list)
    missing: list[str] = field(default_factory=list)      # no server has it (404)
    failed: list[str] = field(default_factory=list)       # "<build-id>: <why>" (server down, too big, not ELF)
    cut: bool = False                                     # the budget ran out before every build-id was asked
    seconds: float = 0.0

    def as_dict(self) -> dict:
        return {"fetched": self.fetched, "missing": self.missing, "failed": self.failed, "cut": self.cut,
                "seconds": round(self.seconds, 3)}


def urls(configured: str, environ: dict | None = None) -> tuple[str, ...]:
    """The servers: `[analysis] debuginfod_urls`, else the daemon's DEBUGINFOD_URLS (both space-separated, as
    elfutils reads it); http and https only."""
    text = configured or (os.environ if environ is None else environ).get("DEBUGINFOD_URLS", "")
    return tuple(u.rstrip("/") for u in text.split() if u.startswith(("http://", "https://")))


def cache_dir(state_dir: Path) -> Path:
    return Path(state_dir) / CACHE_DIR


def search_path(state_dir: Path) -> str:
    """eu-stack's --debuginfo-path: elfutils' default (beside the file, .debug/, /usr/lib/debug) and the cache."""
    return f":.debug:/usr/lib/debug:{cache_dir(state_dir)}"


def reading_cache(limits: findings.Limits, state_dir: Path) -> findings.Limits:
    """limits with the unwinder reading the cache (and the system's debug files) by build-id."""
    return dataclasses.replace(limits, debuginfo_path=search_path(state_dir))


def cached(cache: Path, build_id: str) -> Path:
    return cache / ".build-id" / build_id[:2] / f"{build_id[2:]}.debug"


def system_debug_file(build_id: str, root: Path = Path("/usr/lib/debug")) -> Path:
    """Where a -dbgsym package puts the debug file of that build-id."""
    return root / ".build-id" / build_id[:2] / f"{build_id[2:]}.debug"


def _negative(cache: Path, build_id: str) -> Path:
    return cache / ".negative" / build_id


def fetch(settings: Settings, cache: Path, build_ids, *, now=time.monotonic) -> Report:
    """Fetches the debug files of build_ids that are neither cached nor known missing, within the budget."""
    started = now()
    report = Report()
    deadline = started + settings.budget
    for build_id in dict.fromkeys(b for b in build_ids if b and _BUILD_ID.fullmatch(b)):
        path = cached(cache, build_id)
        if path.exists():
            os.utime(path)  # used again: last out of the cache
            continue
        negative = _negative(cache, build_id)
        try:
            if time.time() - negative.stat().st_mtime < settings.negative_ttl:
                continue
        except FileNotFoundError:
            pass
        if not settings.urls:
            break
        if now() >= deadline:
            report.cut = True
            break
        _fetch_one(settings, cache, build_id, deadline, report, now)
    if report.fetched:
        evict(cache, settings.cache_max)
    report.seconds = now() - started
    return report


def _fetch_one(settings: Settings, cache: Path, build_id: str, deadline: float, report: Report, now) -> None:
    not_found = 0
    why = None
    for url in settings.urls:
        remaining = deadline - now()
        if remaining <= 0:
            report.cut = True
            return
        try:
            if _download(f"{url}/buildid/{build_id}/debuginfo", cached(cache, build_id), settings,
                         min(settings.timeout, remaining), now):
                report.fetched.append(build_id)
                return
            why = "not an ELF file"
        except urllib.error.HTTPError as e:
            if e.code == 404:
                not_found += 1
                continue
            why = f"HTTP {e.code} from {url}"
        except _TooBig as e:
            why = str(e)
        except (OSError, ValueError) as e:  # connection refused, timeout, TLS, a bad URL
            reason = getattr(e, "reason", None) or e
            why = f"{url}: {reason}"
    if not_found == len(settings.urls):
        report.missing.append(build_id)
        negative = _negative(cache, build_id)
        negative.parent.mkdir(parents=True, exist_ok=True)
        negative.touch()
    elif why:
        report.failed.append(f"{build_id}: {why}")


class _TooBig(Exception):
    pass


def _download(url: str, dest: Path, settings: Settings, timeout: float, now) -> bool:
    """True when an ELF file was written to dest; raises what urllib raises, or _TooBig."""
    started = now()
    dest.parent.mkdir(parents=True, exist_ok=True)
    # The analyser runs as a user of its own (jail.py): it must read the cache, whatever the daemon's umask.
    for d in (dest.parent.parent.parent, dest.parent.parent, dest.parent):
        os.chmod(d, 0o755)
    tmp = dest.with_name(f".tmp.{dest.name}.{os.getpid()}")
    with urllib.request.urlopen(url, timeout=timeout) as response:
        length = response.headers.get("Content-Length")
        if length and length.isdigit() and int(length) > settings.file_max:
            raise _TooBig(f"{int(length)} bytes, more than the {settings.file_max} a file may have")
        size = 0
        try:
            with open(os.open(tmp, os.O_WRONLY | os.O_CREAT | os.O_TRUNC | os.O_NOFOLLOW | os.O_CLOEXEC, 0o644),
                      "wb") as out:
                os.fchmod(out.fileno(), 0o644)
                while chunk := response.read(_CHUNK):
                    size += len(chunk)
                    if size > settings.file_max:
                        raise _TooBig(f"more than the {settings.file_max} bytes a file may have")
                    if now() - started > timeout:
                        raise TimeoutError(f"not done in {timeout:g} s")
                    out.write(chunk)
            with open(tmp, "rb") as f:
                if f.read(4) != elfcore.ELFMAG:
                    tmp.unlink()
                    return False
            os.rename(tmp, dest)
        except BaseException:
            tmp.unlink(missing_ok=True)
            raise
    return True


def evict(cache: Path, cache_max: int) -> list[Path]:
    """Removes the least recently used debug files until the cache holds at most cache_max bytes."""
    files = []
    for path in (cache / ".build-id").glob("*/*.debug"):
        try:
            st = path.stat()
        except FileNotFoundError:
            continue
        files.append((st.st_mtime, st.st_blocks * 512, path))
    total = sum(size for _, size, _ in files)
    removed = []
    for _, size, path in sorted(files):
        if total <= cache_max:
            break
        path.unlink(missing_ok=True)
        total -= size
        removed.append(path)
    return removed


class Fetcher:
    """The daemon's fetching thread: dumps wait in a queue, one at a time within its budget, so neither the
    crash path nor another dump's ingest waits for a server. arrived() gives the dumps for which something
    new came; wake() tells the daemon to ask."""

    def __init__(self, cache: Path, wake):
        self.cache = cache
        self._wake = wake
        self._queue: queue.Queue = queue.Queue(maxsize=1024)
        self._arrived: queue.SimpleQueue = queue.SimpleQueue()
        self._thread = threading.Thread(target=self._run, name="debuginfod", daemon=True)
        self._thread.start()

    def want(self, dump_id: str, build_ids: list[str], settings: Settings) -> None:
        try:
            self._queue.put_nowait((dump_id, build_ids, settings))
        except queue.Full:  # a storm of unsymbolised dumps: these wait for `corehandler analyze`
            log.warning("debuginfod queue full: %s is not re-symbolised now", dump_id)

    def arrived(self) -> list[str]:
        out = []
        while True:
            try:
                out.append(self._arrived.get_nowait())
            except queue.Empty:
                return out

    def stop(self) -> None:
        self._queue.put((None, [], None))
        self._thread.join(timeout=5)

    def _run(self) -> None:
        while True:
            dump_id, build_ids, settings = self._queue.get()
            if dump_id is None:
                return
            try:
                report = fetch(settings, self.cache, build_ids)
            except OSError as e:  # the cache's filesystem; the next dump tries again
                log.error("Fetching debug info for %s failed: %s", dump_id, e)
                continue
            for why in report.failed:
                log.warning("debuginfod: %s", why)
            if report.fetched:
                log.info("debuginfod: %d debug files for %s in %.1f s", len(report.fetched), dump_id, report.seconds)
                self._arrived.put(dump_id)
                self._wake()

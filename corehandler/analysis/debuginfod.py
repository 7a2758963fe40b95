"""Debug info by build-id from debuginfod servers, fetched by the daemon (or `corehandler analyze`), never by
the sandboxed analyser, which has no network: it only reads the cache this fills.

The cache is `<state>/debuginfo/.build-id/xx/rest.debug`, the separate-debuginfo layout elfutils searches by
build-id under each absolute directory of its debuginfo path (eu-stack `--debuginfo-path`, search_path()); the
debuginfod client library itself is not used (it would need the network and a writable cache in the sandbox).

Bounded every way: a deadline per request and one per dump, each enforced by shutting the socket down when it passes
(a socket's timeout bounds one read only, and a server sending a byte a second never lets it expire), a size cap per
file and for the whole cache (oldest used first out), negative results (404 from every server) remembered for
`negative_ttl` and at most NEGATIVE_MAX of them, a server that is down (timed out, refused) remembered for the rest
of the pass only (the next dump asks again), at most POOL build-ids asked at once. What is fetched is an ELF file or
nothing: a server's answer is written to a temp file, checked, and renamed into place; a temp file left by a process
that died is swept by the next fetch.

The cache says which build-ids crashed here: its directories are root's, crossable but not listable (0711), so
each analysis, which runs under a uid of its own (jail.py), opens a debug file by the build-id it already knows
and cannot list which others crashed; the negative results are root's alone (0700). Plain http is refused unless
the server is on loopback or `[analysis] debuginfod_allow_http` says so: a debug file steers the unwinder.
"""

from __future__ import annotations

import concurrent.futures
import dataclasses
import http.client
import logging
import os
import queue
import re
import socket
import ssl
import threading
import time
import urllib.error
import urllib.request
from dataclasses import dataclass, field
from pathlib import Path

from corehandler import elfcore
from corehandler.analysis import findings
from corehandler.config import loopback_url

log = logging.getLogger(__name__)

CACHE_DIR = "debuginfo"
_BUILD_ID = re.compile(r"[0-9a-f]{8,128}")
_CHUNK = 1 << 20
NEGATIVE_MAX = 4096
POOL = 4                      # build-ids fetched at once in one pass
_TMP = re.compile(r"\.tmp\..*\.(\d+)")


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


def refused(url: str, allow_http: bool = False) -> bool:
    """Whether a server's URL is refused: anything but https, and http on loopback or when allowed."""
    if url.startswith("https://"):
        return False
    return not (url.startswith("http://") and (allow_http or loopback_url(url)))


def urls(configured: str, environ: dict | None = None, *, allow_http: bool = False) -> tuple[str, ...]:
    """The servers: `[analysis] debuginfod_urls`, else the daemon's DEBUGINFOD_URLS (both space-separated, as
    elfutils reads it); https, and http on loopback or when allow_http."""
    text = configured or (os.environ if environ is None else environ).get("DEBUGINFOD_URLS", "")
    out = []
    for url in text.split():
        if refused(url, allow_http):
            log.warning("debuginfod: %s refused: https only, or http on loopback ([analysis] "
                        "debuginfod_allow_http)", url)
        else:
            out.append(url.rstrip("/"))
    return tuple(out)


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


def _own_dir(path: Path, private: bool = False) -> None:
    """Makes path (or fixes its mode): root's, crossable by every analysis's own uid but listable by none, or
    root's alone when private."""
    path.mkdir(mode=0o700, exist_ok=True)
    os.chmod(path, 0o700 if private else 0o711)


def _alive(pid: int) -> bool:
    try:
        os.kill(pid, 0)
    except ProcessLookupError:
        return False
    except OSError:
        pass
    return True


def tidy(cache: Path, negative_ttl: float) -> None:
    """Puts the cache in order before a fetch: directory modes (a cache made 0755 by an older version is fixed),
    temp files of processes that are gone, negative results past negative_ttl and all but the newest
    NEGATIVE_MAX of them."""
    if not cache.is_dir():
        return
    _own_dir(cache)
    build_ids = cache / ".build-id"
    if build_ids.is_dir():
        _own_dir(build_ids)
        for sub in build_ids.iterdir():
            if sub.is_dir() and not sub.is_symlink():
                _own_dir(sub)
                for entry in sub.iterdir():
                    stale = _TMP.fullmatch(entry.name)
                    if stale and not _alive(int(stale.group(1))):
                        entry.unlink(missing_ok=True)
    negatives = cache / ".negative"
    if negatives.is_dir():
        _own_dir(negatives, private=True)
        entries = []
        for entry in negatives.iterdir():
            try:
                entries.append((entry.stat().st_mtime, entry))
            except FileNotFoundError:
                continue
        entries.sort(reverse=True)
        for rank, (mtime, entry) in enumerate(entries):
            if rank >= NEGATIVE_MAX or time.time() - mtime >= negative_ttl:
                entry.unlink(missing_ok=True)


def fetch(settings: Settings, cache: Path, build_ids, *, now=time.monotonic) -> Report:
    """Fetches the debug files of build_ids that are neither cached nor known missing, within the budget: at most
    POOL at once, and a server that did not answer (a timeout, a refused connection) is not asked again in this
    pass, so a stuck server costs its timeout once, not once per build-id."""
    started = now()
    report = Report()
    tidy(cache, settings.negative_ttl)
    deadline = started + settings.budget
    wanted = []
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
        wanted.append(build_id)
    if wanted:
        down = _Down()
        with concurrent.futures.ThreadPoolExecutor(min(POOL, len(wanted)), thread_name_prefix="debuginfod") as pool:
            parts = list(pool.map(lambda b: _fetch_one(settings, cache, b, deadline, down, now), wanted))
        for part in parts:  # in the build-ids' order, whichever finished first
            report.fetched += part.fetched
            report.missing += part.missing
            report.failed += part.failed
            report.cut |= part.cut
    if report.fetched:
        evict(cache, settings.cache_max)
    report.seconds = now() - started
    return report


class _Down:
    """The servers that did not answer in this pass, and why (shared by the pass's threads)."""

    def __init__(self):
        self._lock = threading.Lock()
        self._why: dict[str, str] = {}

    def why(self, url: str) -> str | None:
        with self._lock:
            return self._why.get(url)

    def mark(self, url: str, why: str) -> None:
        with self._lock:
            self._why.setdefault(url, why)


def _fetch_one(settings: Settings, cache: Path, build_id: str, deadline: float, down: _Down, now) -> Report:
    """One build-id asked of each server in turn, until one has it; what came of it."""
    report = Report()
    not_found = 0
    why = None
    for url in settings.urls:
        if (was := down.why(url)) is not None:
            why = f"{url}: not asked, it did not answer in this pass ({was})"
            continue
        remaining = deadline - now()
        if remaining <= 0:
            report.cut = True
            return report
        limit = min(settings.timeout, remaining)
        try:
            if _download(f"{url}/buildid/{build_id}/debuginfo", cached(cache, build_id), settings, limit):
                report.fetched.append(build_id)
                return report
            why = "not an ELF file"
        except urllib.error.HTTPError as e:
            if e.code == 404:
                not_found += 1
                continue
            why = f"HTTP {e.code} from {url}"
        except _TooBig as e:
            why = str(e)
        except (OSError, ValueError, http.client.HTTPException) as e:  # refused, timeout, TLS, bad URL or reply
            reason = getattr(e, "reason", None) or e
            why = f"{url}: {reason}"
            if isinstance(e, TimeoutError) and limit < settings.timeout:
                report.cut = True  # the dump's budget, not the server, ended it
            elif isinstance(e, OSError) and not isinstance(e, urllib.error.HTTPError):
                down.mark(url, str(reason))
    if not_found == len(settings.urls):
        report.missing.append(build_id)
        negative = _negative(cache, build_id)
        _own_dir(cache)
        _own_dir(negative.parent, private=True)
        negative.touch()
    elif why:
        report.failed.append(f"{build_id}: {why}")
    return report


class _TooBig(Exception):
    pass


class _Deadline:
    """Shuts down every socket opened under it once `seconds` have passed, whatever the server is sending."""

    def __init__(self, seconds: float):
        self.seconds = seconds
        self.passed = False
        self._sockets: list[socket.socket] = []
        self._lock = threading.Lock()
        self._timer = threading.Timer(seconds, self._pass)
        self._timer.daemon = True

    def __enter__(self):
        self._timer.start()
        return self

    def __exit__(self, *exc):
        self._timer.cancel()

    def _pass(self) -> None:
        with self._lock:
            self.passed = True
            for sock in self._sockets:
                try:
                    sock.shutdown(socket.SHUT_RDWR)
                except OSError:
                    pass

    def watch(self, sock: socket.socket) -> None:
        with self._lock:
            self._sockets.append(sock)
        if self.passed:
            self._pass()

    def opener(self) -> urllib.request.OpenerDirector:
        """urllib's opener whose sockets (a redirect's too) are watched from their connect on; a TLS socket
        from its handshake, as wrapping takes the socket's descriptor over."""
        deadline = self

        def create_connection(*args, **kwargs):
            sock = socket.create_connection(*args, **kwargs)
            deadline.watch(sock)
            return sock

        def watched(base):
            class Connection(base):
                def __init__(self, *args, **kwargs):
                    super().__init__(*args, **kwargs)
                    self._create_connection = create_connection
            return Connection

        class SSLSocket(ssl.SSLSocket):
            def do_handshake(self, *args, **kwargs):
                deadline.watch(self)
                return super().do_handshake(*args, **kwargs)

        context = ssl.create_default_context()
        context.sslsocket_class = SSLSocket

        class HTTP(urllib.request.HTTPHandler):
            def http_open(self, req):
                return self.do_open(watched(http.client.HTTPConnection), req)

        class HTTPS(urllib.request.HTTPSHandler):
            def https_open(self, req):
                return self.do_open(watched(http.client.HTTPSConnection), req, context=context)

        return urllib.request.build_opener(HTTP, HTTPS)


def _download(url: str, dest: Path, settings: Settings, timeout: float) -> bool:
    """True when an ELF file was written to dest within timeout seconds; raises what urllib raises, _TooBig, or
    TimeoutError."""
    for d in (dest.parent.parent.parent, dest.parent.parent, dest.parent):
        _own_dir(d)
    tmp = dest.with_name(f".tmp.{dest.name}.{os.getpid()}")
    try:
        with _Deadline(timeout) as deadline:
            try:
                written = _receive(deadline.opener(), url, tmp, settings, timeout)
            except (OSError, http.client.HTTPException):
                if deadline.passed:
                    raise TimeoutError(f"not done in {timeout:g} s") from None
                raise
            if deadline.passed:  # the shut-down socket reads as the body's end: what came is cut short
                raise TimeoutError(f"not done in {timeout:g} s")
        if not written:
            tmp.unlink()
            return False
        os.rename(tmp, dest)
    except BaseException:
        tmp.unlink(missing_ok=True)
        raise
    return True


def _receive(opener, url: str, tmp: Path, settings: Settings, timeout: float) -> bool:
    """Writes the server's answer to tmp; whether it is an ELF file."""
    with opener.open(url, timeout=timeout) as response:
        length = response.headers.get("Content-Length")
        if length and length.isdigit() and int(length) > settings.file_max:
            raise _TooBig(f"{int(length)} bytes, more than the {settings.file_max} a file may have")
        size = 0
        # 0644 in directories only the analyser's group may cross.
        with open(os.open(tmp, os.O_WRONLY | os.O_CREAT | os.O_TRUNC | os.O_NOFOLLOW | os.O_CLOEXEC, 0o644),
                  "wb") as out:
            os.fchmod(out.fileno(), 0o644)
            while chunk := response.read1(_CHUNK):
                size += len(chunk)
                if size > settings.file_max:
                    raise _TooBig(f"more than the {settings.file_max} bytes a file may have")
                out.write(chunk)
    with open(tmp, "rb") as f:
        return f.read(4) == elfcore.ELFMAG


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

"""A real debuginfod (elfutils' server) serving `objcopy --only-keep-debug` files of test programs that are
stripped on disk, on the loopback of a network namespace of its own (debuginfod has no listen-address option,
and a test's server must not listen beyond loopback): `in_netns` runs commands beside it there, so only they can
reach it; outside, the same URL is a server that is down. And `dripping`, a server that sends its answer a byte a
second, for the fetcher's deadline, and `slow`, one that answers late or never, counting what it was asked."""

from __future__ import annotations

import contextlib
import http.server
import json
import shutil
import subprocess
import sys
import threading
from pathlib import Path

from corehandler import elfcore
from support import realcore

PORT = 8002


def url(port: int = PORT) -> str:
    return f"http://127.0.0.1:{port}"


def stripped_with_debug_file(tmp: Path) -> tuple[Path, Path, str]:
    """(the stripped program on disk, the directory the server scans holding its debug file, its build-id)."""
    full = realcore.build(tmp / "build", name="analysed-full")
    served = tmp / "served"
    served.mkdir()
    subprocess.run(["objcopy", "--only-keep-debug", str(full), str(served / "analysed.debug")], check=True)
    disk = tmp / "analysed"
    shutil.copyfile(full, disk)
    subprocess.run(["strip", str(disk)], check=True)
    disk.chmod(0o755)
    build_id = elfcore.file_build_id(disk)
    assert build_id and build_id == elfcore.file_build_id(served / "analysed.debug")
    return disk, served, build_id


_INSIDE = r'''
import json, subprocess, sys, time, urllib.request
served, db, port, build_id, commands = sys.argv[1], sys.argv[2], sys.argv[3], sys.argv[4], json.loads(sys.argv[5])
subprocess.run(["ip", "link", "set", "lo", "up"], check=True)
server = subprocess.Popen(["debuginfod", "-F", "-p", port, "-d", db, "-t", "0", "-g", "0", served],
                          stdout=subprocess.DEVNULL, stderr=subprocess.DEVNULL)
try:
    deadline = time.monotonic() + 120
    while True:
        try:
            with urllib.request.urlopen(f"http://127.0.0.1:{port}/buildid/{build_id}/debuginfo", timeout=5) as r:
                if r.status == 200:
                    break
        except OSError:
            pass
        if time.monotonic() > deadline or server.poll() is not None:
            sys.exit("debuginfod never served the debug file")
        time.sleep(0.2)
    out = []
    for cmd in commands:
        p = subprocess.run(cmd, capture_output=True, text=True, timeout=300)
        out.append({"rc": p.returncode, "stdout": p.stdout, "stderr": p.stderr})
    print(json.dumps(out))
finally:
    server.kill()
    server.wait()
'''


def in_netns(served: Path, build_id: str, commands: list[list[str]], port: int = PORT) -> list[dict]:
    """Runs commands one after the other in a new network namespace whose loopback has the server; returns
    each one's {rc, stdout, stderr}."""
    p = subprocess.run(["unshare", "--net", "--", sys.executable, "-P", "-c", _INSIDE, str(served),
                        str(served.parent / "debuginfod.sqlite"), str(port), build_id, json.dumps(commands)],
                       capture_output=True, text=True, timeout=900)
    assert p.returncode == 0, p.stderr
    return json.loads(p.stdout)


@contextlib.contextmanager
def dripping(body: bytes, *, headers_too: bool = False, rate: float = 1.0):
    """A server on loopback answering every /buildid/ID/debuginfo with body (its Content-Length first) one byte
    per 1/rate seconds, the status line and headers too when headers_too; yields its URL. It stops dripping
    when the client goes or the server is shut."""
    stop = threading.Event()

    class Drip(http.server.BaseHTTPRequestHandler):
        def do_GET(self):  # noqa: N802 (http.server's name)
            head = f"HTTP/1.1 200 OK\r\nContent-Length: {len(body)}\r\nConnection: close\r\n\r\n".encode()
            data = body if not headers_too else head + body
            if not headers_too:
                self.wfile.write(head)
                self.wfile.flush()
            try:
                for i in range(len(data)):
                    if stop.wait(1 / rate):
                        return
                    self.wfile.write(data[i:i + 1])
                    self.wfile.flush()
            except OSError:
                return

        def log_message(self, *args):
            pass

    with _serving(Drip, stop) as address:
        yield address


@contextlib.contextmanager
def _serving(handler, stop: threading.Event):
    """handler served on loopback in threads of its own; yields the URL; stop is set before the server shuts."""
    server = http.server.ThreadingHTTPServer(("127.0.0.1", 0), handler)
    server.daemon_threads = True
    thread = threading.Thread(target=server.serve_forever, daemon=True)
    thread.start()
    try:
        yield f"http://127.0.0.1:{server.server_address[1]}"
    finally:
        stop.set()
        server.shutdown()
        server.server_close()


class Counted:
    """What a `slow` server saw: requests in all and the most it had in flight at once."""

    def __init__(self):
        self.lock = threading.Lock()
        self.requests = 0
        self.in_flight = 0
        self.most_at_once = 0


@contextlib.contextmanager
def slow(body: bytes | None, delay: float):
    """A server on loopback answering every /buildid/ID/debuginfo after `delay` seconds with body, or never
    when body is None (it holds the connection until the client goes or the server is shut: a stuck server);
    yields (its URL, Counted)."""
    stop = threading.Event()
    seen = Counted()

    class Slow(http.server.BaseHTTPRequestHandler):
        def do_GET(self):  # noqa: N802 (http.server's name)
            with seen.lock:
                seen.requests += 1
                seen.in_flight += 1
                seen.most_at_once = max(seen.most_at_once, seen.in_flight)
            try:
                if stop.wait(delay) or body is None:
                    stop.wait()
                    return
                self.send_response(200)
                self.send_header("Content-Length", str(len(body)))
                self.end_headers()
                self.wfile.write(body)
            except OSError:
                return
            finally:
                with seen.lock:
                    seen.in_flight -= 1

        def log_message(self, *args):
            pass

    with _serving(Slow, stop) as address:
        yield address, seen

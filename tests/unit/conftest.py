"""tests/unit is pure Python: no test here starts a process (csplice, the feeder, the daemon, a tool). Tests
that do live in tests/local. This hook holds the tier to its name: a test that spawns anything fails."""

from __future__ import annotations

import sys

import pytest

_SPAWN_EVENTS = {"subprocess.Popen", "os.fork", "os.forkpty", "os.exec", "os.posix_spawn", "os.spawn", "os.system"}
_running: list[str] = []
_spawned: dict[str, str] = {}


def _audit(event: str, args) -> None:
    if _running and event in _SPAWN_EVENTS:
        _spawned.setdefault(_running[-1], f"{event} {args[0] if args else ''}")


sys.addaudithook(_audit)  # audit hooks cannot be removed; it acts only while a tests/unit test runs


@pytest.fixture(autouse=True)
def _no_processes(request):
    _running.append(request.node.nodeid)
    try:
        yield
    finally:
        _running.pop()
    what = _spawned.pop(request.node.nodeid, None)
    if what:
        pytest.fail(f"a tests/unit test started a process ({what}): move it to tests/local", pytrace=False)


@pytest.fixture
def s3mock():
    """moto's S3 with one bucket, fleet-test: fault injection and fleet logic without a server."""
    moto = pytest.importorskip("moto", reason="moto is a test dependency (scripts/pip/test.txt)")
    import boto3

    with moto.mock_aws():
        client = boto3.client("s3", region_name="us-east-1")
        client.create_bucket(Bucket="fleet-test")
        yield client


@pytest.fixture
def s3gets(s3mock) -> list[str]:
    """The keys s3mock's get_object is asked for from now on, in order (clear() it between steps)."""
    gets: list[str] = []
    real_get = s3mock.get_object

    def counting_get(**kw):
        gets.append(kw["Key"])
        return real_get(**kw)
    s3mock.get_object = counting_get
    return gets

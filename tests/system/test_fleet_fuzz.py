"""Fuzzing the fleet's readers through the real S3 server: hostile index parts, compacted days and sidecars
(seeded random mutations of honest ones, and the handcrafted bombs of tests/support/fleetbombs.py) fed to
every reader (`fleet list`, `--group`, `query`, `compact`, `info`, `get`), each run in a forked child under an
address-space limit. Every run must end in an exit code (a clean error or warnings naming the keys), never
an exception, a signal or the memory the bombs would take decoded (tens of GiB).

COREHANDLER_FUZZ_SEED picks other mutations; a failure names its seed."""

from __future__ import annotations

import io
import json
import os
import random
import resource
import sys

import pytest

from corehandler.fleet import bucket as layout
from corehandler.fleet import dataset
from support import fleetbombs
from support.fleethost import Host
from support.fleetrows import DAY, put_old_part, put_sidecar, sidecar

pytestmark = pytest.mark.s3

SEED = int(os.environ.get("COREHANDLER_FUZZ_SEED", "34"))
MUTANTS = 6          # of each kind of object, per run
HEADROOM = 3 << 30   # address space a reader may add to what the test process already maps
RSS_BOUND = 1 << 30  # resident memory a reader may add


def mutate(data: bytes, rng: random.Random) -> bytes:
    """One of: bytes flipped (anywhere, or in a Parquet file's footer at the end), cut short, spliced with
    random bytes, or a stretch repeated."""
    data = bytearray(data)
    kind = rng.randrange(5)
    if kind == 0:
        for _ in range(rng.randint(1, 8)):
            data[rng.randrange(len(data))] = rng.randrange(256)
    elif kind == 1:  # the footer: schema, row groups, sizes
        for _ in range(rng.randint(1, 4)):
            data[len(data) - 1 - rng.randrange(min(len(data), 400))] = rng.randrange(256)
    elif kind == 2:
        del data[rng.randrange(len(data)):]
    elif kind == 3:
        at = rng.randrange(len(data))
        data[at:at] = rng.randbytes(rng.randint(1, 64))
    else:
        at = rng.randrange(len(data))
        data[at:at] = data[at:at + rng.randint(1, 256)] * rng.randint(2, 50)
    return bytes(data)


def reshape(sc: dict, rng: random.Random) -> dict:
    """A sidecar with a field of another type than its schema says (another host's JSON may say anything)."""
    odd = [None, True, -1, 2**70, 1e308, "x" * 1000, "\x1b[31m\udcff", [], [1, "a"], {}, {"k": []}]
    paths = [("id",), ("crashed_at",), ("host",), ("signature",), ("budget",), ("schema",), ("core",),
             ("core", "key"), ("core", "bytes"), ("core", "raw_bytes"), ("core", "part_size"), ("index",),
             ("index", "exe"), ("index", "signal"), ("index", "uid"), ("analysis",), ("analysis", "threads"),
             ("mini",), ("sealed",), ("no_core",), ("no_core", "reason"), ("no_core", "why"), ("record",),
             ("record", "capture"), ("record", "capture", "dropped_reason"), ("index", "status"),
             ("analysis", "signature_id"), ("analysis", "signature_v1_id")]
    for _ in range(rng.randint(1, 4)):
        path = rng.choice(paths)
        here = sc
        for p in path[:-1]:
            if not isinstance(here.get(p), dict):
                here[p] = {}
            here = here[p]
        here[path[-1]] = rng.choice(odd)
    return sc


def capped(fn) -> tuple[object, int]:
    """fn() in a forked child limited to the address space this process maps plus HEADROOM: ("ok", its
    value) or ("raised", the exception), and how much resident memory the child added."""
    with open("/proc/self/status") as f:
        status = dict(line.split(":", 1) for line in f)
    mapped = int(status["VmSize"].split()[0]) * 1024
    resident = int(status["VmRSS"].split()[0]) * 1024
    r, w = os.pipe()
    pid = os.fork()
    if pid == 0:  # the child: never back into pytest
        try:
            os.close(r)
            resource.setrlimit(resource.RLIMIT_AS, (mapped + HEADROOM, mapped + HEADROOM))
            try:
                outcome = ["ok", fn()]
            except BaseException as e:  # noqa: BLE001 (what the test is about)
                outcome = ["raised", f"{type(e).__name__}: {e}"[:4000]]
            with os.fdopen(w, "w") as out:
                json.dump(outcome, out, default=str)
        finally:
            os._exit(0)
    os.close(w)
    with os.fdopen(r) as f:
        text = f.read()
    _, status_code, usage = os.wait4(pid, 0)
    assert os.WIFEXITED(status_code), f"seed {SEED}: the reader died of signal {os.WTERMSIG(status_code)}"
    assert text, f"seed {SEED}: the reader left no outcome"
    return json.loads(text), usage.ru_maxrss * 1024 - resident


def run_cli(host: Host, *args: str):
    """The CLI as host, in the child: (exit code, stderr)."""
    def go():
        sys.stdout, sys.stderr = io.StringIO(), io.StringIO()
        os.environ["XDG_CACHE_HOME"] = str(host.root / "cache")
        from corehandler.cli import main

        code = main(["--config-dir", str(host.config_dir), "--state-dir", str(host.state), *args])
        return code, sys.stderr.getvalue()
    return capped(go)


def check(outcome, added: int, what: str) -> tuple[int, str]:
    state, value = outcome
    assert state == "ok", f"seed {SEED}: {what} raised {value}"
    code, err = value
    assert isinstance(code, int) and "Traceback" not in err, f"seed {SEED}: {what}: {err}"
    assert added < RSS_BOUND, f"seed {SEED}: {what} took {added >> 20} MiB more"
    return code, err


def test_hostile_parts_days_and_sidecars_leave_every_reader_standing(tmp_path, s3):
    rng = random.Random(SEED)
    bucket = s3.new_bucket()
    alpha = Host(tmp_path, s3, bucket, "alpha")
    client = s3.client()
    fleet = layout.Target(bucket, "fleet", "any")
    honest = [sidecar(h, n) for h in ("alpha", "beta") for n in range(3)]
    for sc in honest:
        put_sidecar(client, fleet, sc)
    part = client.get_object(Bucket=bucket, Key=dataset.part_key(fleet, "alpha", DAY, 0))["Body"].read()
    put_old_part(client, fleet, [sidecar("old", n, core=n % 2 == 0) for n in range(3)])  # index schema 1
    old = client.get_object(Bucket=bucket, Key=dataset.part_key(fleet, "old", DAY, 0))["Body"].read()

    parts = [mutate(part, rng) for _ in range(MUTANTS)] + [mutate(old, rng) for _ in range(MUTANTS // 2)] + [
        fleetbombs.dictionary_bomb(), fleetbombs.wide_bomb(), fleetbombs.string_times(),
        fleetbombs.claims_host("alpha"), b"", b"PAR1", rng.randbytes(4096)]
    for n, body in enumerate(parts):
        client.put_object(Bucket=bucket, Key=dataset.part_key(fleet, f"part{n}", DAY, 0), Body=body)
    ids = []
    bodies = [mutate(json.dumps(sidecar("side", 100 + n)).encode(), rng) for n in range(MUTANTS)]
    bodies += [json.dumps(reshape(sidecar("side", 200 + n, core=n % 2 == 0), rng), default=str).encode()
               for n in range(MUTANTS)]
    bodies += list(fleetbombs.bad_sidecars("x").values())
    for n, body in enumerate(bodies):
        dump_id = sidecar("side", 300 + n)["id"]
        client.put_object(Bucket=bucket, Key=fleet.day_prefix(f"side{n}", DAY) + dump_id + ".json", Body=body)
        ids.append(dump_id)

    day = ["--date", str(DAY)]
    for args in (["list", "--json"], ["list", "--group"], ["query", "SELECT * FROM dumps"], ["compact"]):
        code, err = check(*run_cli(alpha, "fleet", *args, *day), " ".join(args))
        assert code == 0, f"seed {SEED}: fleet {' '.join(args)} exited {code}: {err}"
        if args[0] != "compact":
            assert f"{fleet.index_day_prefix(DAY)}host=part{len(parts) - 1}/" in err  # named, not silent
    for dump_id in rng.sample(ids, 3):
        check(*run_cli(alpha, "fleet", "info", dump_id), f"fleet info {dump_id}")
        check(*run_cli(alpha, "fleet", "get", dump_id, "-o", str(tmp_path / "core")), f"fleet get {dump_id}")
    assert not (tmp_path / "core").exists()  # no forged sidecar names a core of its own

    # The day compacted: its file damaged in place (the name that covers the parts), a reader falls back.
    daily = [k for k in s3.keys(bucket, dataset.daily_prefix(fleet, DAY))]
    assert len(daily) == 1
    good = client.get_object(Bucket=bucket, Key=daily[0])["Body"].read()
    for n in range(2):  # the parts' outcomes come from the cache: each run reads the new day's file only
        client.put_object(Bucket=bucket, Key=daily[0], Body=mutate(good, rng))
        code, err = check(*run_cli(alpha, "fleet", "list", "--json", *day), f"damaged day {n}")
        assert code == 0, err
    client.put_object(Bucket=bucket, Key=daily[0], Body=fleetbombs.dictionary_bomb())
    code, err = check(*run_cli(alpha, "fleet", "list", "--json", *day), "a bomb for a day")
    assert code == 0 and "reading the day's parts instead" in err

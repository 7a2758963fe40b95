"""What does uploading a dump to the fleet bucket cost, and how fast is the fleet view?

Against a real S3 server on loopback (SeaweedFS weed mini, as in the tests), all in one run:
1. Throughput: 256 MiB and 1 GiB stored dumps (incompressible zstd files, so the object is as large as the
   dump) uploaded the way the daemon does (corehandler.fleet.upload: SHA-256 digests, multipart with per-part
   checksums, HEAD verification, sidecar), against the same server's raw PUT of the same file (one
   put_object, no checksum): median of --rounds interleaved rounds, the ratio paired round by round, and the
   uploader's CPU seconds per GiB (this process's user+system time and its encrypting child's, the
   server's not included).
2. Crash -> available: the feeder pipes a 64 MiB core into csplice (as the kernel would), the daemon ingests
   it and the uploader sends it; the clock stops when the sidecar answers a HEAD.
3. `fleet list --group` over a synthetic fleet (--fleet DUMPS,DAYS,HOSTS, default 1,000,000 dumps in 100
   days from 1,000 hosts) as the hosts' index files leave it, cold (empty cache) and warm.
4. `fleet list` of sidecars no index file covers (v1 hosts): 1,000 of one day over 10 hosts, read one by one.
Encryption (`[upload] recipients`, two keys) is measured beside the clear upload in 1.

    python -P bench/upload.py [--rounds 3] [--fleet 1000000,100,1000] [--out bench/results/upload.md]
                              [--note "what else the machine was doing"]
"""

from __future__ import annotations

import argparse
import datetime
import hashlib
import json
import os
import resource
import sys
import tempfile
import time
from concurrent.futures import ThreadPoolExecutor
from pathlib import Path

HERE = Path(__file__).resolve().parent
sys.path.insert(0, str(HERE))
sys.path.insert(0, str(HERE.parent / "tests"))

from common import filesystem_of, machine, markdown_table, median, paired_ratio  # noqa: E402

from corehandler import paths  # noqa: E402
from corehandler.config import UploadConfig  # noqa: E402
from corehandler.daemon import Settings  # noqa: E402
from corehandler.fleet import (
    bucket,  # noqa: E402
    reader,  # noqa: E402
    upload,  # noqa: E402
)
from corehandler.store import upload_queue  # noqa: E402
from corehandler.store.dumprow import row_from_record  # noqa: E402
from corehandler.store.index import Store  # noqa: E402
from support import cbuild  # noqa: E402
from support.daemon_harness import Running  # noqa: E402
from support.s3server import S3Server  # noqa: E402
from support.spoolfeed import feed, write_settings  # noqa: E402
from support.waiting import wait_for  # noqa: E402

MiB, GiB = 1 << 20, 1 << 30


def cpu() -> float:
    """This process's CPU seconds and its waited-for children's: the encrypting child of seal.py, which an
    upload waits for (the server, a child not waited for until the end, is not in it)."""
    return sum(r.ru_utime + r.ru_stime for r in map(resource.getrusage, (resource.RUSAGE_SELF,
                                                                          resource.RUSAGE_CHILDREN)))


def machine_state() -> str:
    meminfo = dict(line.split(":", 1) for line in Path("/proc/meminfo").read_text().splitlines())
    cached = int(meminfo["Cached"].split()[0]) / 2**20  # kB -> GiB
    free = int(meminfo["MemAvailable"].split()[0]) / 2**20
    return f"load average {os.getloadavg()[0]:.2f} {os.getloadavg()[1]:.2f} {os.getloadavg()[2]:.2f}, " \
           f"page cache {cached:.1f} GiB, available {free:.1f} GiB"


def make_dump(state: Path, size: int, n: int) -> str:
    """A state dir's store with one dump whose .zst file is `size` bytes of incompressible zstd."""
    import zstandard

    dump_id = f"{int(time.time() * 1e6) + n}-0123456789abcdef-{n}"
    store_dir = state / "store"
    store_dir.mkdir(parents=True, exist_ok=True)
    digest, raw = hashlib.sha256(), 0
    with open(store_dir / f"{dump_id}.zst", "wb") as f:
        writer = zstandard.ZstdCompressor(level=1).stream_writer(f, closefd=False)
        while raw < size:
            chunk = os.urandom(min(8 * MiB, size - raw))
            digest.update(chunk)
            raw += len(chunk)
            writer.write(chunk)
        writer.close()
    record = {"id": dump_id, "signal": 11, "timestamp": time.time(), "proc": {"exe": "/usr/bin/bench"}, "capture": {}}
    with Store(state) as store:
        store.insert(row_from_record(record, status="ok", problem=None, path=f"{dump_id}.zst", raw_bytes=raw,
                                     stored_bytes=(store_dir / f"{dump_id}.zst").stat().st_size,
                                     sha256=digest.hexdigest()))
        upload_queue.ensure_schema(store.db)
        upload_queue.enqueue(store.db, dump_id)
    return dump_id


def throughput(server: S3Server, work: Path, creds: Path, size: int, rounds: int) -> dict:
    from pyrage import x25519

    bucket_name = server.new_bucket()
    cfg = UploadConfig.model_validate({"url": f"s3://{bucket_name}/bench", "endpoint": server.endpoint,
                                       "credentials_file": str(creds), "host": "bench"})
    # Two recipients, as a fleet with a break-glass key has.
    cfg_age = cfg.model_copy(update={"recipients": [str(x25519.Identity.generate().to_public()) for _ in range(2)]})
    raw_client = server.client(request_checksum_calculation="when_required")
    sha_client = server.client()
    ours, raw, raw_sha, cpu_ours, age, cpu_age = [], [], [], [], [], []
    for r in range(rounds):
        state = work / f"tp-{size}-{r}"
        dump_id = make_dump(state, size, r)
        path = state / "store" / f"{dump_id}.zst"
        nbytes = path.stat().st_size

        def run_raw():
            t = time.monotonic()
            with open(path, "rb") as f:
                raw_client.put_object(Bucket=bucket_name, Key=f"raw/{dump_id}", Body=f)
            raw.append(nbytes / (time.monotonic() - t))
            raw_client.delete_object(Bucket=bucket_name, Key=f"raw/{dump_id}")

        def run_raw_sha():
            # What a checksummed upload costs by itself: the same PUT with botocore's SHA-256 of the body.
            t = time.monotonic()
            with open(path, "rb") as f:
                sha_client.put_object(Bucket=bucket_name, Key=f"raw/{dump_id}", Body=f, ChecksumAlgorithm="SHA256")
            raw_sha.append(nbytes / (time.monotonic() - t))
            raw_client.delete_object(Bucket=bucket_name, Key=f"raw/{dump_id}")

        def run_ours(config=cfg, rates=ours, cpus=cpu_ours):
            uploader = upload.Uploader(config, state)
            with Store(state) as store:
                store.db.execute("UPDATE uploads SET core = NULL")  # no note of an earlier round's core
                store.db.commit()
                uploader._client = uploader._client_factory()
                c, t = cpu(), time.monotonic()
                assert uploader.upload_one(store, dump_id), "upload failed"
                rates.append(nbytes / (time.monotonic() - t))
                cpus.append((cpu() - c) / (nbytes / GiB))
            for key in server.keys(bucket_name, "bench/"):
                raw_client.delete_object(Bucket=bucket_name, Key=key)

        def run_age():
            run_ours(cfg_age, age, cpu_age)

        # Interleaved, the order rotating, so load from the machine's other users hits all alike.
        steps = [run_raw, run_raw_sha, run_ours, run_age]
        for step in steps[r % 4:] + steps[:r % 4]:
            step()
        path.unlink()
    return {"ours": ours, "raw": raw, "raw_sha": raw_sha, "cpu": cpu_ours, "age": age, "cpu_age": cpu_age}


def crash_to_available(server: S3Server, work: Path, creds: Path, rounds: int) -> list[float]:
    csplice, feeder = paths.csplice_path(), cbuild.feeder()
    bucket_name = server.new_bucket()
    state = work / "c2a"
    (state / "spool").mkdir(parents=True, mode=0o700)
    settings = write_settings(work / "c2a-csplice.conf", state / "spool")
    cfg = UploadConfig.model_validate({"url": f"s3://{bucket_name}/bench", "endpoint": server.endpoint,
                                       "credentials_file": str(creds), "host": "bench"})
    client, times = server.client(), []
    uploader = upload.Uploader(cfg, state)
    with Running(Settings(state, threads=1, sweep_interval=3600), [uploader]):
        for r in range(rounds):
            before = set(server.keys(bucket_name, "bench/"))
            t = time.monotonic()
            feed(feeder, csplice, settings, size=64 * MiB, pid=3000 + r)
            wait_for(lambda: any(k.endswith(".json") for k in set(server.keys(bucket_name, "bench/")) - before),
                     timeout=120, interval=0.01, what="the sidecar in the bucket")
            times.append(time.monotonic() - t)
    del client
    return times


def fleet_bucket(server: S3Server, creds: Path) -> tuple[bucket.Target, object]:
    """A new bucket and the reading side's client of it, as `fleet list` makes it."""
    cfg = UploadConfig.model_validate({"url": f"s3://{server.new_bucket()}/bench", "endpoint": server.endpoint,
                                       "credentials_file": str(creds), "host": "bench"})
    return bucket.target(cfg), bucket.client(cfg, pool=reader.WORKERS + 4)


def fleet_listing(server: S3Server, work: Path, creds: Path, count: int, rounds: int) -> tuple[list, list]:
    """Sidecars no index file covers (v1 hosts, a host killed before its index write): read one by one."""
    target, client = fleet_bucket(server, creds)
    bucket_name = target.bucket
    now = time.time()
    day = bucket.crash_day(now)

    def put(i: int) -> None:
        host, dump_id = f"host-{i % 10}", f"{int(now * 1e6) + i}-0123456789abcdef-{i}"
        body = json.dumps({"schema": 2, "id": dump_id, "host": host, "crashed_at": now, "signature": f"sig-{i % 7}",
                           "core": None, "index": {"exe": "/usr/bin/x", "signal": 11}, "record": {}})
        client.put_object(Bucket=bucket_name, Key=target.dump_key(now, dump_id, ".json", host), Body=body.encode())

    with ThreadPoolExecutor(32) as pool:
        list(pool.map(put, range(count)))
    cold, warm = [], []
    for r in range(rounds):
        # Cold: a new cache, every sidecar read (what the first `fleet list` of a day costs); warm: the same
        # listing again, only the prefix listings (what every later one costs, plus the day's new dumps).
        cache = reader.SidecarCache(work / f"cache-{count}-{r}.sqlite")
        for times in (cold, warm):
            t = time.monotonic()
            found, _ = reader.list_sidecars(client, target, [day], cache=cache)
            times.append(time.monotonic() - t)
            assert len(found) == count, len(found)
        cache.close()
    return cold, warm


def synthetic_fleet(client, target, dumps: int, days: int, hosts: int) -> list[datetime.date]:
    """`dumps` dumps over `days` days from `hosts` hosts, as the hosts' uploaders leave the index: one Parquet
    file per host and day (dataset.py's rows; signatures drawn from a long tail of 500)."""
    import random

    from corehandler.fleet import dataset

    last = datetime.datetime.now(datetime.timezone.utc).date()
    day_list = [last - datetime.timedelta(days=d) for d in range(days)]
    per_file = max(1, dumps // (days * hosts))

    def put(job: tuple[int, int]) -> None:
        h, d = job
        rand = random.Random(h * 100003 + d)
        day, host = day_list[d], f"host-{h:04d}"
        base = datetime.datetime.combine(day, datetime.time(), datetime.timezone.utc).timestamp()
        rows = []
        for i in range(per_file):
            ts = base + rand.uniform(0, 86399)
            sig = f"crasher{int(rand.paretovariate(1.2)) % 500} SIGSEGV f{i % 5} < main"
            dump_id = f"{int(ts * 1e6)}-0123456789abcdef-{i}"
            rows.append(dataset.row({"schema": 2, "id": dump_id, "host": host, "crashed_at": ts, "uploaded_at": ts,
                                     "signature": sig, "signature_source": "analysis", "budget": None,
                                     "core": {"key": "k", "bytes": 1000} if i % 3 else None,
                                     "index": {"exe": "/usr/bin/crasher", "signal": 11, "status": "ok",
                                               "raw_bytes": 4096}, "analysis": None},
                                    f"{target.day_prefix(host, day)}{dump_id}.json"))
        client.put_object(Bucket=target.bucket, Key=dataset.part_key(target, host, day, 0),
                          Body=dataset.to_parquet(rows))

    with ThreadPoolExecutor(16) as pool:
        list(pool.map(put, [(h, d) for h in range(hosts) for d in range(days)]))
    return sorted(day_list)


# Reading every host's own file of every day is O(files) GETs: measured up to this many files (at 1,000 hosts
# and 100 days it is 100,000 GETs, which is what compaction exists for).
PER_HOST_READ_MAX = 20_000


def fleet_group(server: S3Server, work: Path, creds: Path, dumps: int, days: int, hosts: int,
                rounds: int, report_too: bool = False) -> list[list]:
    """`fleet list --group` over the whole synthetic fleet: what the CLI runs (fleetview.collect, fleetview.link,
    GROUP_SQL), over the hosts' files as they are (one round: O(files) GETs cold), then after `fleet compact`
    of every day (`rounds` rounds). With report_too, `fleet report` (its three queries and the HTML page) instead of
    GROUP_SQL."""
    from corehandler.fleet import dataset, fleetview, report

    target, client = fleet_bucket(server, creds)
    t = time.monotonic()
    day_list = synthetic_fleet(client, target, dumps, days, hosts)
    print(f"synthetic fleet made in {time.monotonic() - t:.0f}s", flush=True)

    def measure(label: str, n: int, extra: str) -> list:
        cold, warm, total = [], [], 0
        for r in range(n):
            cache = reader.SidecarCache(work / f"group-{label}-{r}.sqlite")
            for times in (cold, warm):
                t = time.monotonic()
                view = fleetview.collect(client, target, day_list, cache=cache)
                if report_too:  # what `fleet report` adds: its queries and the page
                    data = report.collect(view.connect(), day_list, 50, None, "bench", view.skipped)
                    report.page(data)
                    total = data["totals"]["dumps"]
                else:
                    _, groups = fleetview.rows(fleetview.link(view.connect()), fleetview.GROUP_SQL)
                    total = sum(g[1] for g in groups)
                times.append(time.monotonic() - t)
                view.close()
            cache.close()
            print("group", label, cold[-1], warm[-1], total, flush=True)
        return [label, f"{total:,}", str(days), f"{hosts:,}", f"{median(cold):.2f}", spread(cold),
                f"{median(warm):.2f}", spread(warm), extra]

    out = [measure("per-host files", 1, f"{days * hosts:,} files")] if days * hosts <= PER_HOST_READ_MAX else []
    # The steady state of a fleet: every past day compacted (by a timer on any host, or an admin), today's
    # dumps still in the hosts' own files; then today compacted too.
    t = time.monotonic()
    with ThreadPoolExecutor(8) as pool:
        list(pool.map(lambda d: dataset.compact(client, target, d), day_list[:-1]))
    took = time.monotonic() - t
    print(f"compacted in {took:.0f}s", flush=True)
    out.append(measure("past days compacted, today per host", rounds,
                       f"cold {days - 1} + {hosts:,} files, warm {days} (today's merged locally); "
                       f"`fleet compact` of {days - 1} days took {took:.0f} s"))
    dataset.compact(client, target, day_list[-1])
    out.append(measure("every day compacted", rounds, f"{days} files"))
    return out


def spread(values: list[float], fmt: str = "{:.2f}") -> str:
    return f"{fmt.format(min(values))}–{fmt.format(max(values))}"


def main() -> int:
    p = argparse.ArgumentParser()
    p.add_argument("--rounds", type=int, default=3)
    p.add_argument("--out", type=Path, default=HERE / "results" / "upload.md")
    p.add_argument("--sizes", default="256,1024", help="dump sizes in MiB")
    p.add_argument("--listings", default="1000", help="uncovered sidecars of one day to list, e.g. 1000,10000")
    p.add_argument("--fleet", default="1000000,100,1000", help="DUMPS,DAYS,HOSTS of the synthetic fleet that "
                   "`fleet list --group` reads; \"\" = skip (its table is then upload-fleet.md's)")
    p.add_argument("--report", action="store_true", help="time `fleet report` (its queries and page) over the "
                   "synthetic fleet instead of `fleet list --group`")
    p.add_argument("--note", default="", help="what else the machine was doing, for the results' header")
    a = p.parse_args()
    started = machine_state()
    with tempfile.TemporaryDirectory(prefix="upload-bench-", dir="/var/tmp") as tmp:
        work = Path(tmp)
        server = S3Server(work / "s3").start()
        try:
            creds = server.credentials_file(work / "credentials")
            rows = []
            for mib in (map(int, a.sizes.split(",")) if a.sizes else ()):
                r = throughput(server, work, creds, mib * MiB, a.rounds)
                raw_mib, sha_mib, ours_mib, age_mib = ([x / MiB for x in r[k]]
                                                       for k in ("raw", "raw_sha", "ours", "age"))
                rows.append([f"{mib} MiB", f"{median(raw_mib):.0f} ({spread(raw_mib, '{:.0f}')})",
                             f"{median(sha_mib):.0f} ({spread(sha_mib, '{:.0f}')})",
                             f"{median(ours_mib):.0f} ({spread(ours_mib, '{:.0f}')})",
                             f"{median(age_mib):.0f} ({spread(age_mib, '{:.0f}')})",
                             f"{paired_ratio(r['ours'], r['raw']):.2f}", f"{paired_ratio(r['raw_sha'], r['raw']):.2f}",
                             f"{paired_ratio(r['age'], r['ours']):.2f}",
                             f"{median(r['cpu']):.2f} ({spread(r['cpu'])})",
                             f"{median(r['cpu_age']):.2f} ({spread(r['cpu_age'])})"])
                print(rows[-1], flush=True)
            c2a = crash_to_available(server, work, creds, a.rounds)
            print("crash->available", c2a, flush=True)
            groups = []
            if a.fleet:
                dumps, days, hosts = map(int, a.fleet.split(","))
                groups = fleet_group(server, work, creds, dumps, days, hosts, a.rounds, a.report)
            listings = []
            for count in (map(int, a.listings.split(",")) if a.listings else ()):
                cold, warm = fleet_listing(server, work, creds, count, a.rounds)
                listings.append([f"{count:,}", f"{median(cold):.2f}", spread(cold), f"{count / median(cold):.0f}",
                                 f"{median(warm):.2f}", spread(warm)])
                print(listings[-1], flush=True)
        finally:
            server.stop()
        fs = filesystem_of(work)
    ended = machine_state()
    command = " ".join(["python -P bench/upload.py", *(f'"{x}"' if not x or " " in x else x for x in sys.argv[1:])])
    fleet_part = [
        f"## `fleet {'report' if a.report else 'list --group'}` over a synthetic fleet ({a.rounds} rounds)", "",
        markdown_table(["read from", "dumps", "days", "hosts", "cold median s", "cold min–max s",
                        "warm median s", "warm min–max s", "files read"], groups),
        "What the CLI runs (fleetview.collect, then "
        + ("fleet/report.py's queries and its HTML page" if a.report else "GROUP_SQL")
        + " on DuckDB) over every day of the fleet. The "
        "fleet is made as the hosts' uploaders leave it: one Parquet index file per host and day (per-host "
        "files: one round), then every day compacted by `fleet compact`. Cold: an empty local cache, every "
        "file fetched (GETs in a pool of 32 threads); warm: the same again with the local cache: a LIST per "
        "compacted day (three for a day not compacted) and DuckDB over the cached files, a day's part files "
        "read from the one file the cache merged them into while none changed.", "",
    ] if groups else [
        "## `fleet list --group` over a synthetic fleet", "",
        "See [upload-fleet.md](upload-fleet.md): 1,000,000 dumps from 1,000 hosts in 100 days.", "",
    ]
    text = [
        "# Upload to the fleet bucket (bench/upload.py)", "",
        f"Generated by `{command}`" + (f" ({a.note})" if a.note else "") + ".", "",
        f"{datetime.datetime.now(datetime.timezone.utc):%Y-%m-%d %H:%M} UTC, {machine()}.",
        f"Server: SeaweedFS `weed mini` on 127.0.0.1 (data on {fs}); client: boto3 as the daemon runs it "
        "(fleet/transfer.py: 16 MiB parts, 4 in parallel, SHA-256 per part, HEAD verification, then the sidecar).",
        f"Machine at start: {started}; at end: {ended}. Absolute figures move with the load, the paired ratios "
        "less.", "",
        f"## Throughput (MiB/s, median of {a.rounds} interleaved rounds, min–max in brackets)", "",
        markdown_table(["dump", "raw PUT", "raw PUT, SHA-256", "corehandler upload", "corehandler, encrypted",
                        "ours ÷ raw PUT (paired)", "raw PUT, SHA-256 ÷ raw PUT", "encrypted ÷ ours (paired)",
                        "client CPU s/GiB", "encrypted: client CPU s/GiB"], rows) if rows else "(not run)",
        "Raw PUT: one put_object of the same file with no checksum header, the same client library and server "
        "(the floor; over http botocore still hashes the body once, for the signature). Raw PUT, SHA-256: the "
        "same with botocore's SHA-256 checksum of the body (two passes: checksum and signature). corehandler's "
        "upload reads the file once, in parts it hashes once and sends with that SHA-256 as their checksum "
        "(which the server checks, and which is signed, so botocore hashes nothing again), HEADs the result, "
        "then writes the sidecar and the host's index file of the day. Encrypted: the same with `[upload] "
        "recipients` (two age X25519 keys): the file is encrypted by a child process as it is read and the "
        "ciphertext hashed as it goes up; the child's CPU is in the CPU column.", "",
        f"## Crash -> available in the bucket (64 MiB feeder core, {a.rounds} rounds)", "",
        markdown_table(["median s", "min–max s"], [[f"{median(c2a):.2f}", spread(c2a)]]),
        "From the feeder starting to pipe the core into csplice to the sidecar answering HEAD: capture, ingest "
        "(validate, zstd, verify, index), then upload and verification.", "",
        *fleet_part,
        f"## `fleet list` of one day's sidecars no index file covers ({a.rounds} rounds)", "",
        markdown_table(["sidecars", "cold median s", "cold min–max s", "cold sidecars/s", "cached median s",
                        "cached min–max s"], listings),
        f"Sidecars of hosts on the v1 layout or killed before their index write are read one by one: one listing "
        f"per host (10 hosts) and one GET per sidecar in a pool of {reader.WORKERS} threads "
        "(boto3 costs some milliseconds of client CPU per request, so on two busy CPUs this is CPU-bound). "
        "Cached: the same listing with the local sidecar cache (key + ETag) `fleet list` keeps, so only new "
        "sidecars are read.", "",
    ]
    a.out.write_text("\n".join(text))
    print(a.out.read_text())
    return 0


if __name__ == "__main__":
    sys.exit(main())

"""Fuzzing the parsers of what a crashing process controls: the spool record (JSON), the core's notes
(NT_PRSTATUS, NT_PRPSINFO, NT_FILE, NT_SIGINFO), the package note, the module listing, the reason line; and
of what another host of the fleet controls: a sidecar in the shared bucket (its index files:
tests/system/test_fleet_fuzz.py, under a memory cap against the real S3 server).

Each parser either answers or raises its module's own error type, never anything else, and each input is
bounded in time (hypothesis's per-example deadline, generous for a loaded machine: the inputs are small, a
quadratic or exponential path is what it catches). The run is bounded by max_examples, so it runs in CI."""

from __future__ import annotations

import json
import struct
import tempfile
from datetime import timedelta
from pathlib import Path

from hypothesis import HealthCheck, example, given, settings
from hypothesis import strategies as st

from corehandler import boundedjson, elfcore, spool
from corehandler.analysis import coremodules, findings
from corehandler.fleet import bucket, dataset, reader
from corehandler.store.dumprow import row_from_record
from corehandler.store.index import Store
from support import synthcore

FUZZ = settings(max_examples=300, deadline=timedelta(seconds=5), derandomize=True,
                suppress_health_check=[HealthCheck.too_slow, HealthCheck.data_too_large])
ID = "1700000000000000-0123456789abcdef-42"

json_scalars = st.none() | st.booleans() | st.integers(-2**70, 2**70) | st.floats(allow_nan=False) | st.text()
json_values = st.recursive(json_scalars, lambda inner: st.lists(inner, max_size=4) |
                           st.dictionaries(st.text(max_size=8), inner, max_size=4), max_leaves=20)
# The record's own keys, so the fuzzer reaches the fields the readers use, with values of any type.
RECORD_KEYS = ["schema", "id", "core", "pid", "tid", "uid", "gid", "signal", "timestamp", "dumpable", "rlimit_core",
               "hostname", "comm", "boot_id", "specifiers", "proc", "capture", "handler", "errors", "unreadable",
               "orphan"]
PROC_KEYS = ["exe", "comm", "status", "cgroup", "cmdline", "environ", "maps", "ns", "container", "userns_owner",
             "truncated", "oci_config", "available"]
CAPTURE_KEYS = ["socket", "truncated_reason", "dropped_reason", "error", "bytes", "complete", "truncated", "dropped",
                "ns"]


@st.composite
def records(draw) -> dict:
    rec = {"schema": 1, "id": ID}
    rec.update(draw(st.dictionaries(st.sampled_from(RECORD_KEYS), json_values, max_size=8)))
    if draw(st.booleans()):
        rec["proc"] = draw(st.dictionaries(st.sampled_from(PROC_KEYS), json_values, max_size=6))
    if draw(st.booleans()):
        rec["capture"] = draw(st.dictionaries(st.sampled_from(CAPTURE_KEYS), json_values, max_size=6))
    return rec


def _read(data: bytes) -> dict | None:
    with tempfile.TemporaryDirectory() as d:
        (Path(d) / f"{ID}.json").write_bytes(data)
        try:
            return spool.read_record(Path(d), ID)
        except spool.SpoolRecordError:
            return None


def _index(record: dict) -> None:
    """What ingest does with a record it accepted: the index row (stored and read back), identity, and the
    result of an analysis that found nothing."""
    with tempfile.TemporaryDirectory() as d, Store(Path(d)) as store:
        store.insert(row_from_record(record, status="metadata_only", problem=None, path=None, raw_bytes=0,
                                     stored_bytes=0, sha256=None))
        assert store.get(ID).record == json.loads(json.dumps(record))
        json.dumps(findings.skipped(record, "fuzz"))


@FUZZ
@given(st.binary(max_size=4096))
@example(b"[" * 2000)
@example(b'{"schema": 1, "id": "' + ID.encode() + b'", "proc": ' + b"[" * 5000 + b"}")
def test_record_bytes(data):
    record = _read(data)
    if record is not None:
        _index(record)


@FUZZ
@given(records())
@example({"schema": 1, "id": ID, "proc": {"cmdline": ["a", 1]}})
@example({"schema": 1, "id": ID, "uid": 2**64})
@example({"schema": 1, "id": ID, "boot_id": "\udcff\n", "hostname": "\udcfe", "comm": "\x1b]0;x\x07"})
@example({"schema": 1, "id": ID, "proc": {"container": {"id": "[" * 3000, "annotations": [1]}}})
def test_record_fields(record):
    accepted = _read(json.dumps(record).encode())
    if accepted is not None:
        _index(accepted)


@FUZZ
@given(st.text(max_size=2048))
@example("[" * 100_000)
@example('"' + "\\" * 4097)
def test_bounded_json(text):
    try:
        boundedjson.loads(text, max_bytes=1 << 20)
    except boundedjson.BoundedJSONError:
        pass


@FUZZ
@given(st.binary(max_size=coremodules.MAX_PACKAGE_NOTE + 16))
@example(b"[" * 2000)
@example(b"{" * 3000)
@example(b'{"a":' * 900 + b"1" + b"}" * 900)
def test_package_note(desc):
    value = coremodules.parse_package(desc)
    assert value is None or isinstance(value, dict)
    json.dumps(value)  # stored in the analysis and in a user's view: serialisable at any depth it has


nt_file_entries = st.lists(st.tuples(st.integers(0, 2**64 - 1), st.integers(0, 2**64 - 1), st.integers(0, 2**64 - 1),
                                     st.binary(max_size=40)), max_size=40)


@st.composite
def nt_file_descs(draw) -> bytes:
    entries = draw(nt_file_entries)
    count = draw(st.sampled_from([len(entries), 0, 2**64 - 1, 2**32, len(entries) + 1])) if draw(st.booleans()) \
        else len(entries)
    desc = struct.pack("<QQ", count, draw(st.sampled_from([4096, 0, 2**64 - 1])))
    desc += b"".join(struct.pack("<QQQ", *e[:3]) for e in entries)
    desc += b"".join(e[3].replace(b"\0", b"") + b"\0" for e in entries)
    return desc[:draw(st.integers(0, len(desc)))] if draw(st.booleans()) else desc


def _core_file(data: bytes) -> Path:
    f = tempfile.NamedTemporaryFile(delete=False)
    f.write(data)
    f.close()
    return Path(f.name)


def _parse_core(data: bytes) -> None:
    path = _core_file(data)
    try:
        info = elfcore.inspect_core(path)
        assert info.status in (elfcore.STATUS_OK, elfcore.STATUS_TRUNCATED, elfcore.STATUS_INVALID)
        try:
            modules, cut = coremodules.modules(path, problems=[])
        except OSError:
            return
        json.dumps(modules)
    finally:
        path.unlink()


@FUZZ
@given(nt_file_descs(), st.lists(st.tuples(st.integers(0, 40), st.binary(min_size=1, max_size=1)), max_size=6))
def test_nt_file_and_module_listing(desc, flips):
    """A well-formed core around a hostile NT_FILE note, with one mapping a small ELF image (build-id,
    package note), then a few bytes of the whole changed: both parsers of the core answer."""
    image = synthcore.elf_image(b"\x01" * 20, b'{"name": "x"}')
    mappings = [synthcore.Mapping(0x400000, 0x401000, 0, b"/bin/x", image)]
    data = bytearray(synthcore.core(mappings, nt_file_desc=desc))
    for at, byte in flips:
        data[at * len(data) // 41] = byte[0]
    _parse_core(bytes(data))


@FUZZ
@given(st.binary(max_size=512), st.integers(0, 3))
@example(b"\x7fELF\x02\x01\x01" + b"\0" * 9 + struct.pack("<HH", 4, 62), 0)
def test_core_bytes(tail, how):
    """Arbitrary bytes, and arbitrary bytes behind a real core's headers (ELF header, program headers, the
    first bytes of the notes)."""
    real = synthcore.core([synthcore.Mapping(0x400000, 0x401000, 0, b"/bin/x", synthcore.elf_image(b"\x02" * 20))])
    prefix = (b"", real[:64], real[:64 + 2 * 56], real[:200])[how]
    _parse_core(prefix + tail)


@FUZZ
@given(st.binary(max_size=2048), st.sampled_from(["<", ">"]), st.sampled_from([32, 64]))
@example(struct.pack("<III", 5, 2**31, elfcore.NT_FILE) + b"CORE\0\0\0\0", "<", 64)
def test_note_segment(data, end, bits):
    """The note walker on any bytes: what it returns, and the notes the core validation takes from it."""
    layout = elfcore._LAYOUTS[elfcore.ELFCLASS64 if bits == 64 else elfcore.ELFCLASS32]
    info = elfcore.CoreInfo()
    elfcore._parse_notes(info, data, end, layout)
    for owner, ntype, desc in elfcore.iter_notes(data, end):
        assert isinstance(owner, bytes) and isinstance(desc, bytes)


def test_the_fuzzed_record_shapes_are_the_ones_read():
    """The fuzzer's keys follow spool's shape table: a field added there is fuzzed too."""
    assert set(spool._SHAPE) <= set(RECORD_KEYS) and set(spool._PROC_SHAPE) <= set(PROC_KEYS)


@FUZZ
@given(st.binary(max_size=200), st.binary(max_size=600), st.sampled_from(["<", ">"]), st.sampled_from([32, 64]),
       st.sampled_from([62, 183, 243, 3, 40, 8, 0, 0xFFFF]))
@example(b"\x0b\0\0\0\0\0\0\0\x01\0\0\0", b"", "<", 64, 62)
@example(b"\x0b\0\0\0", b"\0" * 300, "<", 64, 62)
def test_siginfo_and_prstatus_notes(siginfo, prstatus, end, bits, machine):
    """NT_SIGINFO and NT_PRSTATUS of any length and content, on any machine: the core's validation answers,
    and the reason line is a string (or nothing)."""
    from corehandler.analysis import reason
    layout = elfcore._LAYOUTS[elfcore.ELFCLASS64 if bits == 64 else elfcore.ELFCLASS32]

    def note(ntype, desc):
        return struct.pack(end + "III", 5, len(desc), ntype) + b"CORE\0\0\0\0" + desc + b"\0" * (-len(desc) % 4)
    info = elfcore.CoreInfo(machine=machine)
    elfcore._parse_notes(info, note(elfcore.NT_PRSTATUS, prstatus) + note(elfcore.NT_SIGINFO, siginfo), end, layout)
    assert info.siginfo is None or all(isinstance(v, int) for v in info.siginfo.values())
    assert info.sp is None or isinstance(info.sp, int)
    line = reason.explain(info.signal, info.siginfo, info.sp, {info.pid})
    assert line is None or isinstance(line, str)


SIDECAR_KEYS = ["schema", "id", "host", "crashed_at", "uploaded_at", "signature", "signature_source", "core",
                "budget", "sha256", "index", "record", "analysis", "mini", "sealed"]
NESTED_KEYS = {"core": ["key", "bytes", "raw_bytes", "raw_sha256", "checksum", "object_sha256", "part_size",
                        "encryption", "recipients", "compression"],
               "index": ["exe", "comm", "signal", "uid", "status", "raw_bytes"],
               "analysis": ["state", "signature_id", "exact_key", "threads"]}
FLEET = bucket.Target("fleet-test", "p", "any")
SIDECAR_KEY = FLEET.day_prefix("alpha", bucket.id_day(ID)) + ID + ".json"


@st.composite
def sidecars(draw) -> dict:
    sc = {"schema": 2, "id": ID}
    sc.update(draw(st.dictionaries(st.sampled_from(SIDECAR_KEYS), json_values, max_size=6)))
    for name, keys in NESTED_KEYS.items():
        if draw(st.booleans()):
            sc[name] = draw(st.dictionaries(st.sampled_from(keys), json_values, max_size=5))
    if draw(st.booleans()):
        sc.setdefault("analysis", {})
        if isinstance(sc["analysis"], dict):
            sc["analysis"]["threads"] = draw(st.lists(st.dictionaries(
                st.sampled_from(["crashing", "tid", "frames"]), json_values | st.lists(json_values), max_size=3),
                max_size=3))
    return sc


def _read_sidecar(body: bytes) -> None:
    """A sidecar's bytes through every reader of one: skipped with its own error, or rows of the index's types."""
    try:
        sc = reader._parse(FLEET, SIDECAR_KEY, body)
    except reader.SkippedSidecar as e:
        assert SIDECAR_KEY in e.message
        return
    assert sc["host"] == "alpha"  # the key's, whatever it says
    dataset.to_parquet([dataset.row(sc, SIDECAR_KEY)])
    listed = reader.row(sc)
    assert listed["core_bytes"] is None or isinstance(listed["core_bytes"], int)
    dataset.crashing_frames(sc)


@FUZZ
@given(st.binary(max_size=4096))
@example(b"\xff\xfe{}")
@example(b"[" * 100_000)
def test_sidecar_bytes(data):
    _read_sidecar(data)


@FUZZ
@given(sidecars())
@example({"schema": 2, "id": ID, "index": [1], "core": "k", "analysis": {"threads": [1, {"frames": "x"}]}})
@example({"schema": 2, "id": ID, "crashed_at": 1e300, "core": {"bytes": 2**70}, "index": {"signal": 2**40}})
@example({"schema": True, "id": ID, "host": "../beta"})
def test_sidecar_fields(sc):
    _read_sidecar(json.dumps(sc).encode())

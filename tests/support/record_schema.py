"""The spool record's schema 1, as docs/design.md documents it, checked field by field."""

from __future__ import annotations

import re

from corehandler import spool
from corehandler.analysis import identity
from corehandler.csplice_contract import PHASES, PIDFD_SPECIFIER, STRATEGIES
from corehandler.csplice_contract import SPECIFIERS as _ARGV

SPECIFIERS = tuple(spec.removeprefix("%") for spec in (*_ARGV.split(), PIDFD_SPECIFIER))
TRUNCATED_REASONS = (None, "max_dump_size", "min_free", "timeout", "read_error", "write_error", "rlimit_core")
# Admission's reasons, then the capture's when it kept not one byte ("empty": none came).
DROPPED_REASONS = (None, "max_pending", "max_pending_per_uid", "max_per_exe_per_minute", "min_free", "create_failed",
                   "rlimit_core", "max_dump_size", "socket_error", "timeout", "read_error", "write_error", "empty")
SOCKET_ERRORS = (None, "peer_gone", "bad_request_size", "bad_ack_size", "kernel_unsupported", "reject_unsupported",
                 "short_ack", "short_mark", "ack_refused", "read_error")
SOCKET = {"handshake": bool, "request_size": int, "request_mask": int, "ack_mask": int, "rejected": bool,
          "mark": (int, type(None)), "coredump_mask": int, "error": (str, type(None))}
SETTINGS = {
    "source": str, "from_file": bool, "error": (str, type(None)), "spool_dir": str, "strategy": str,
    "chunk_size": int, "pipe_size": int, "max_dump_size": int, "direct_above": int, "min_free": (int, str),
    "max_pending": int, "max_pending_per_uid": int, "max_per_exe_per_minute": int, "timeout": int, "fsync": bool,
    "sparse": bool, "io_realtime": bool, "collect_environ": bool, "collect_maps": bool,
}

CONTAINER_RUNTIMES = ("docker", "containerd", "cri-o", "podman")
CONTAINER_ANNOTATIONS = tuple(name for names in identity.ANNOTATIONS.values() for name in names)
# The /proc files csplice cuts at a cap (procinfo.c), in bytes.
PROC_CAPS = {"comm": 64, "cmdline": 4096, "status": 16384, "cgroup": 8192, "environ": 32768, "maps": 1 << 20}

NAMESPACES = ("cgroup", "ipc", "mnt", "net", "pid", "time", "user", "uts")
OptStr = (str, type(None))
OptInt = (int, type(None))


def _check(cond: bool, what: str) -> None:
    if not cond:
        raise AssertionError(f"record schema: {what}")


def _typed(obj: dict, key: str, types, where: str) -> None:
    _check(key in obj, f"{where}.{key} missing")
    value = obj[key]
    # bool is an int in Python; a count must not be a bool and a flag must be one.
    if types is int or (isinstance(types, tuple) and int in types and bool not in types):
        _check(not isinstance(value, bool), f"{where}.{key} is a bool, want {types}")
    _check(isinstance(value, types), f"{where}.{key} = {value!r}, want {types}")


def check_record(rec: dict) -> None:
    """Raises AssertionError naming the first field that does not match docs/design.md's schema 1."""
    _typed(rec, "schema", int, "record")
    _check(rec["schema"] == 1, f"schema {rec['schema']}")
    _typed(rec, "id", str, "record")
    _check(spool.is_valid_id(rec["id"]), f"id {rec['id']!r}")
    _typed(rec, "core", OptStr, "record")
    if rec["core"] is not None:
        _check(rec["core"] == rec["id"] + ".core", f"core {rec['core']!r}")

    _typed(rec, "specifiers", dict, "record")
    _check(set(rec["specifiers"]) == set(SPECIFIERS), f"specifier keys {sorted(rec['specifiers'])}")
    for key in SPECIFIERS:
        _typed(rec["specifiers"], key, OptStr, "specifiers")
    for key in ("pid", "tid", "uid", "gid", "signal", "timestamp", "dumpable"):
        _typed(rec, key, OptInt, "record")
    for key in ("rlimit_core", "hostname", "comm", "boot_id"):
        _typed(rec, key, OptStr, "record")
    if rec["boot_id"] is not None:
        _check(bool(re.fullmatch(r"[0-9a-f]{32}", rec["boot_id"])), f"boot_id {rec['boot_id']!r}")

    proc = rec["proc"]
    _typed(proc, "available", bool, "proc")
    for key in ("exe", "comm", "status", "cgroup"):
        _typed(proc, key, OptStr, "proc")
    _typed(proc, "cmdline", (list, type(None)), "proc")
    for arg in proc["cmdline"] or []:
        _check(isinstance(arg, str), f"cmdline item {arg!r}")
    if "environ" in proc:
        _typed(proc, "environ", (list, type(None)), "proc")
    if "maps" in proc:
        _typed(proc, "maps", OptStr, "proc")
    _typed(proc, "ns", dict, "proc")
    _check(set(proc["ns"]) == set(NAMESPACES), f"ns keys {sorted(proc['ns'])}")
    for key in NAMESPACES:
        _typed(proc["ns"], key, OptStr, "proc.ns")
    _typed(proc, "container", (dict, type(None)), "proc")
    if proc["container"] is not None:
        ctr = proc["container"]
        _check(set(ctr) == {"id", "runtime", "annotations"}, f"proc.container keys {sorted(ctr)}")
        _check(isinstance(ctr["id"], str) and bool(re.fullmatch(r"[0-9a-f]{64}", ctr["id"])), "container.id")
        _check(ctr["runtime"] in CONTAINER_RUNTIMES, f"container.runtime {ctr['runtime']!r}")
        _typed(ctr, "annotations", dict, "proc.container")
        for key, value in ctr["annotations"].items():
            _check(key in CONTAINER_ANNOTATIONS and isinstance(value, str), f"annotation {key!r}: {value!r}")
    _typed(proc, "userns_owner", (int, type(None)), "proc")
    _typed(proc, "truncated", list, "proc")
    _check(set(proc["truncated"]) <= set(PROC_CAPS), f"proc.truncated {proc['truncated']!r}")
    if proc["available"]:
        _typed(proc, "start_ticks", int, "proc")
    _typed(proc, "verified_by", OptStr, "proc")
    _check(proc["verified_by"] in (None, "pidfd", "start_time"), f"verified_by {proc['verified_by']!r}")
    _typed(proc, "verified", bool, "proc")

    cap = rec["capture"]
    _typed(cap, "strategy", OptStr, "capture")
    _check(cap["strategy"] in STRATEGIES + (None,), f"strategy {cap['strategy']!r}")
    _typed(cap, "io_realtime", bool, "capture")
    _check(not cap["io_realtime"] or rec["handler"]["settings"]["io_realtime"], "capture.io_realtime not asked for")
    _typed(cap, "direct_from", (int, type(None)), "capture")
    _check(cap["direct_from"] is None or (cap["strategy"] == "rw" and cap["direct_from"] % 4096 == 0),
           f"capture.direct_from {cap['direct_from']!r} with strategy {cap['strategy']!r}")
    for key in ("bytes", "drained_bytes", "timeout_seconds", "ns", "ended_realtime_ns"):
        _typed(cap, key, int, "capture")
        _check(cap[key] >= 0, f"capture.{key} < 0")
    _typed(cap, "throughput_bytes_per_second", (int, float), "capture")
    _typed(cap, "mode", str, "capture")
    _check(cap["mode"] in ("pipe", "socket"), f"capture.mode {cap['mode']!r}")
    _typed(cap, "socket", (dict, type(None)), "capture")
    _check((cap["socket"] is None) == (cap["mode"] == "pipe"), "capture.socket vs capture.mode")
    if cap["socket"] is not None:
        _check(set(cap["socket"]) == set(SOCKET), f"capture.socket keys {sorted(cap['socket'])}")
        for key, types in SOCKET.items():
            _typed(cap["socket"], key, types, "capture.socket")
        _check(cap["socket"]["error"] in SOCKET_ERRORS, f"capture.socket.error {cap['socket']['error']!r}")
        _check(not cap["socket"]["rejected"] or cap["dropped"], "rejected but not dropped")
    for key in ("complete", "truncated", "dropped", "elf_magic"):
        _typed(cap, key, bool, "capture")
    _typed(cap, "phases", dict, "capture")
    _check(list(cap["phases"]) == list(PHASES), f"capture.phases keys {list(cap['phases'])}")
    for key in (*(f"phases.{p}" for p in PHASES), "longest_read_ns", "longest_write_ns"):
        where, name = ("capture.phases", key.split(".")[1]) if "." in key else ("capture", key)
        _typed(cap["phases"] if "." in key else cap, name, int, where)
    ph = cap["phases"]
    # Set-up in its order, every step of the copy before the release, the release before the core's publishing
    # (the copy's own steps vary: rw's hand-off to direct maps its ring after the first byte).
    setup = [ph[p] for p in ("settings", "metadata", "admitted", "created")]
    _check(0 < ph["released"] and setup == sorted(setup) and setup[0] > 0, f"capture.phases set-up: {ph}")
    _check(all(setup[-1] <= ph[p] <= ph["released"] for p in ("ring", "first_byte", "handoff", "eof") if ph[p]),
           f"capture.phases copy: {ph}")
    _check(ph["published"] == 0 or ph["published"] >= ph["released"], f"capture.phases published: {ph}")
    _check((ph["published"] > 0) == (rec["core"] is not None), "capture.phases.published vs core")
    _typed(cap, "truncated_reason", OptStr, "capture")
    _check(cap["truncated_reason"] in TRUNCATED_REASONS, f"truncated_reason {cap['truncated_reason']!r}")
    _typed(cap, "error", OptStr, "capture")
    _typed(cap, "dropped_reason", OptStr, "capture")
    _check(cap["dropped_reason"] in DROPPED_REASONS, f"dropped_reason {cap['dropped_reason']!r}")
    # The flags agree with each other and with the core file's presence.
    _check(cap["truncated"] == (cap["truncated_reason"] is not None), "truncated vs truncated_reason")
    _check(cap["dropped"] == (cap["dropped_reason"] is not None), "dropped vs dropped_reason")
    _check(cap["dropped"] == (rec["core"] is None), "dropped vs core")
    _check(not (cap["complete"] and (cap["truncated"] or cap["dropped"])), "complete and truncated/dropped")
    if cap["dropped"]:
        _check(cap["bytes"] == 0, "a dropped dump has bytes")
    else:
        _check(cap["complete"] or cap["truncated"], "kept but neither complete nor truncated")

    handler = rec["handler"]
    _check(handler.get("name") == "csplice", f"handler.name {handler.get('name')!r}")
    _typed(handler, "version", str, "handler")
    _typed(handler, "started_realtime_ns", int, "handler")
    _check(cap["ended_realtime_ns"] >= handler["started_realtime_ns"], "the process released before csplice started")
    _typed(handler, "settings", dict, "handler")
    for key, types in SETTINGS.items():
        _typed(handler["settings"], key, types, "handler.settings")
    _check(handler["settings"]["strategy"] in STRATEGIES, "settings.strategy")

    _typed(rec, "errors", list, "record")
    for err in rec["errors"]:
        _check(isinstance(err, str), f"errors item {err!r}")

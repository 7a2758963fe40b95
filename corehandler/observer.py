"""What the daemon tells its observers (journald, metrics, the scrub, the uploader, tests): the Observer protocol,
Quiet, and the `Stored` event, which the daemon builds from the dump's index row so that every observer sees the
figures the index keeps. A leaf: every part implements or calls this contract, so it imports none of them."""

from __future__ import annotations

import dataclasses
from collections.abc import Mapping
from dataclasses import dataclass
from typing import Any, Protocol


@dataclass(frozen=True)
class Stored(Mapping):
    """A dump as the daemon indexed it: what on_ingested and on_stored report beside the spool record.
    Read-only and a Mapping of its fields, so observers that read crash figures defensively
    (`fields.number(stored, ...)`) take it as they take any mapping. While status is `compressing` the stored
    file's figures are not known yet: path, stored_bytes and compress_seconds are None."""

    id: str
    path: str | None          # the stored file, None for a dropped dump (and while compressing)
    raw_bytes: int
    stored_bytes: int | None
    compress_seconds: float | None
    ingest_seconds: float     # until the event: listed (on_ingested), or stored too (on_stored)
    ingested_at: float
    status: str
    problem: str | None
    analysis: Mapping[str, Any] | None

    def __getitem__(self, key: str) -> Any:
        if key not in _FIELDS:
            raise KeyError(key)
        return getattr(self, key)

    def __iter__(self):
        return iter(_FIELDS)

    def __len__(self) -> int:
        return len(_FIELDS)


_FIELDS = tuple(f.name for f in dataclasses.fields(Stored))


class Observer(Protocol):
    """Every event the daemon reports. An observer never stops ingest: the daemon logs and counts what one
    raises. Observers inherit Quiet for the events they do not care about."""

    def on_start(self) -> None: ...
    # The dump is being listed: its analysis is stored, its index row is committed right after the event (each
    # event comes at least once, twice after a kill in between: daemon.py). stored.status `compressing`: its
    # core is being stored, and on_stored follows; any other status is final, and nothing follows.
    def on_ingested(self, record: Mapping[str, Any], stored: Stored) -> None: ...
    # A dump announced `compressing` is stored and verified: stored has its final status and figures.
    def on_stored(self, record: Mapping[str, Any], stored: Stored) -> None: ...
    def on_deleted(self, dump_id: str, exe: str | None, rule: str, freed_bytes: int) -> None: ...
    # A crash whose pod's policy keeps nothing (pods/policy.py): its spool files are gone, no row was made.
    # source: what decided it (default, namespace, annotation).
    def on_excluded(self, record: Mapping[str, Any], source: str) -> None: ...
    def on_error(self, kind: str, message: str, dump_id: str | None) -> None: ...
    def on_state(self, backlog: int, store_bytes: int, store_count: int) -> None: ...
    def close(self) -> None: ...


class Quiet:
    """An observer that ignores every event: the base of observers that want only some."""

    def on_start(self) -> None:
        pass

    def on_ingested(self, record: Mapping[str, Any], stored: Stored) -> None:
        pass

    def on_stored(self, record: Mapping[str, Any], stored: Stored) -> None:
        pass

    def on_deleted(self, dump_id: str, exe: str | None, rule: str, freed_bytes: int) -> None:
        pass

    def on_excluded(self, record: Mapping[str, Any], source: str) -> None:
        pass

    def on_error(self, kind: str, message: str, dump_id: str | None) -> None:
        pass

    def on_state(self, backlog: int, store_bytes: int, store_count: int) -> None:
        pass

    def close(self) -> None:
        pass

"""The background scrub (store/scrub.py): a stored file that rots on disk is found and marked corrupt by the
running daemon, at a bounded read rate, before anyone runs `dump` or `info`: `status`, `list --json`, the
corrupt-dumps gauge and errors_total{kind="corrupt"} all say so."""

from __future__ import annotations

import functools
import json
import threading

from corehandler.cli import main
from corehandler.daemon import Settings
from corehandler.observe.metrics import MetricsObserver
from corehandler.store import compress, scrub
from corehandler.store.index import Store
from support import daemon_harness
from support.daemon_harness import Running, wait_for
from support.spoolfeed import fed_state


def all_stored(state):
    with Store(state, readonly=True) as s:
        return all(d.path for d in s.all())


def test_a_rotten_stored_file_is_found_by_the_scrub_alone(tmp_path, capsys):
    state, etc = fed_state(tmp_path, (4101, 4102, 4103), "scrubbed")
    metrics = MetricsObserver(state_dir=state)
    sample = functools.partial(daemon_harness.sample, metrics)

    with Running(Settings(state, threads=1, sweep_interval=0.1), [metrics]):
        wait_for(lambda: sample("corehandler_store_dumps") == 3, what="three dumps indexed")
        wait_for(lambda: all_stored(state), what="their cores stored")
    with Store(state) as s:
        rotten = s.all()[1]
    path = state / "store" / rotten.path
    data = bytearray(path.read_bytes())
    data[len(data) // 2] ^= 0xFF  # same size, same header: only reading it all back finds it
    path.write_bytes(bytes(data))

    scrubber = scrub.Scrubber(state, scrub.Policy(rate=64 << 20, interval=3600))
    with Running(Settings(state, threads=1, sweep_interval=0.1), [metrics, scrubber]):
        wait_for(lambda: scrubber.passes == 1, what="a scrub pass")
        wait_for(lambda: sample("corehandler_errors_total", kind="corrupt") == 1, what="the daemon reported it")
        assert sample("corehandler_store_corrupt_dumps") == 1
    base = ["--config-dir", str(etc), "--state-dir", str(state)]
    capsys.readouterr()
    assert main(base + ["--json", "status"]) == 0
    assert json.loads(capsys.readouterr().out)["store"]["corrupt"] == 1
    assert main(base + ["--json", "list"]) == 0
    listed = {d["id"]: (d["status"], d["corefile"]) for d in json.loads(capsys.readouterr().out)}
    assert listed.pop(rotten.id) == ("corrupt", "corrupt")
    assert set(listed.values()) == {("ok", "present")}
    with Store(state) as s:
        assert s.get(rotten.id).corrupt.startswith("scrub: ")


class _Clock(threading.Event):
    """An event whose waits are noted, not slept."""

    def __init__(self):
        super().__init__()
        self.waits = []

    def wait(self, timeout=None):
        self.waits.append(timeout)
        return False


def test_the_scrub_reads_at_its_rate(tmp_path):
    """Reading 8 MiB at 2 MiB/s asks for waits adding up to the 4 s the rate allows (counted, not slept)."""
    stored = tmp_path / "x.core"
    stored.write_bytes(bytes(8 << 20))
    clock = _Clock()
    pace = scrub.Pace(2 << 20, clock)
    compress.verify(stored, 8 << 20, None, pace=pace)
    assert pace.done == 8 << 20
    assert 3.5 < max(clock.waits) <= 4.0

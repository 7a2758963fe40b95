"""coremodules on cores with tens of thousands of mappings (issue 20, item 6: one crash with ~32k mappings cost
the daemon ~87 s of CPU, quadratic in the mappings). The work is counted, not timed: the Python lines the
module runs, against a baseline of the same core shape 32 times smaller, in the same test."""

from __future__ import annotations

import sys

from corehandler import elfcore
from corehandler.analysis import coremodules
from support import synthcore


class _TooMuchWork(Exception):
    pass


def lines_run(call, limit: int) -> int:
    """How many lines of coremodules.py call() runs; _TooMuchWork past limit (a quadratic listing would run
    billions)."""
    count = 0
    filename = coremodules.__file__

    def local(frame, event, arg):
        nonlocal count
        if event == "line":
            count += 1
            if count > limit:
                raise _TooMuchWork(f"more than {limit} lines")
        return local

    sys.settrace(lambda frame, event, arg: local if frame.f_code.co_filename == filename else None)
    try:
        call()
    finally:
        sys.settrace(None)
    return count


def write_core(path, n: int, elf_every: int = 0):
    path.write_bytes(synthcore.core(synthcore.many_mappings(n, elf_every)))
    return path


def test_listing_32k_mappings_costs_n_log_n_not_n_squared(tmp_path):
    small = write_core(tmp_path / "small", 1024)
    large = write_core(tmp_path / "large", 32 * 1024)
    baseline = lines_run(lambda: coremodules.modules(small), limit=10**7)
    # Linear would be 32x the baseline, n log n ~48x; the old listing's was ~1000x.
    work = lines_run(lambda: coremodules.modules(large), limit=64 * baseline)
    assert work < 64 * baseline
    problems: list[str] = []
    assert coremodules.modules(large, problems=problems) == ([], True)
    assert problems == [f"module listing stopped after {coremodules.MAX_EXAMINED} mapped files (its cap)"]
    assert elfcore.inspect_core(large).files[-1] == f"/synth/data{32 * 1024 - 1}.so"


def test_libraries_among_data_files_are_all_found(tmp_path):
    core = write_core(tmp_path / "core", 4096, elf_every=16)
    modules, cut = coremodules.modules(core)
    assert not cut and len(modules) == 256
    assert modules[1]["build_id"] == (16).to_bytes(20, "big").hex()


def test_the_listing_stops_at_its_time_budget(tmp_path):
    core = write_core(tmp_path / "core", 64, elf_every=2)
    problems: list[str] = []
    assert coremodules.modules(core, budget=0.0, problems=problems) == ([], True)
    assert problems == ["module listing stopped after 0 mapped files (its 0 s budget)"]


def test_nt_file_entries_past_the_cap_are_not_read(tmp_path):
    n = coremodules.MAX_FILE_ENTRIES + 100
    mappings = [synthcore.Mapping(0x1000 * i, 0x1000 * i + 0x1000, 1, b"/f", b"") for i in range(n)]
    path = tmp_path / "core"
    path.write_bytes(synthcore.core(mappings))
    problems: list[str] = []
    assert coremodules.modules(path, problems=problems) == ([], False)
    assert problems == [f"module listing read the first {coremodules.MAX_FILE_ENTRIES} of the core's mapped "
                        "files only"]

"""analyze: the matching dumps analysed again, now: with the debug info debuginfod has for them by now (fetched
here, within [analysis] debuginfod_budget) and any -dbgsym package installed since. The exact key stays what it
was (build-ids and offsets); the names, files and lines are new. Reads the mini core when the dump has one (the
same frames, none of the decompression), else the full core, and says which."""

from __future__ import annotations

import argparse
import dataclasses
import os
import tempfile
from pathlib import Path

from corehandler.analysis import debuginfod, findings, pyframes, reason, symbols, unwind
from corehandler.cli.common import emit, load
from corehandler.cli.selection import add_match_options, select
from corehandler.errors import NoMatchError, NotRootError
from corehandler.ingest import analysis_limits, debuginfod_settings
from corehandler.printable import display
from corehandler.store import analyses, compress, userview
from corehandler.store.dumprow import Dump
from corehandler.store.index import Store


def register(commands) -> None:
    p = commands.add("analyze", run_analyze, help="analyse matching dumps again, fetching their debug info from "
                     "debuginfod first (root)")
    add_match_options(p)


def _analyse(store: Store, d: Dump, limits: findings.Limits, tmp: Path) -> dict:
    mini, full = store.mini_path(d), store.file_path(d)
    if mini is not None and mini.exists():
        core, which = mini, "mini"
    elif full is not None:
        core, which = tmp / f"{d.id}.core", "full"
        with open(os.open(core, os.O_WRONLY | os.O_CREAT | os.O_EXCL, 0o600), "wb") as out:
            compress.decompress_to(full, out)
    else:
        return dict(findings.skipped(d.record, "no core left to analyse"), core=None)
    try:
        result = unwind.analyse(core, d.record, limits)
        if which == "full":  # a mini core cannot give Python frames: carry_over keeps the first analysis's
            pyframes.add(result, core, d.record, limits)
    finally:
        if which == "full":
            core.unlink()
    result["core"] = which
    symbols.annotate(result, store.state_dir)
    return result


def run_analyze(args: argparse.Namespace) -> int:
    if os.geteuid() != 0:
        raise NotRootError("analyze writes the index and needs root")
    config, paths = load(args)
    fetching = debuginfod_settings(config)
    cache = debuginfod.cache_dir(paths.state_dir)
    limits = debuginfod.reading_cache(analysis_limits(config), paths.state_dir)
    out, lines = [], []
    with Store(paths.state_dir) as store, tempfile.TemporaryDirectory(prefix="corehandler-analyze-") as tmp:
        found = [d for d in select(args, store) if d.path or d.mini_path]
        if not found:
            raise NoMatchError("no matching dump has a core left to analyse")
        for d in found:
            before = analyses.analysis_for(store, d.id)
            report = debuginfod.fetch(fetching, cache, symbols.wanted(before or {}))
            result = _analyse(store, d, limits, Path(tmp))
            if before is None and fetching.urls:  # nothing said what to fetch: the first pass says it
                # One budget for the dump, both passes: what the first spent is gone.
                rest = dataclasses.replace(fetching, budget=max(0.0, fetching.budget - report.seconds))
                more = debuginfod.fetch(rest, cache, symbols.wanted(result))
                if more.fetched:
                    result = _analyse(store, d, limits, Path(tmp))
                report = dataclasses.replace(report, fetched=report.fetched + more.fetched,
                                             missing=report.missing + more.missing, failed=report.failed + more.failed,
                                             cut=report.cut or more.cut)
            result["debuginfod"] = report.as_dict()
            reason.carry_over(before, result)
            pyframes.carry_over(before, result, d.record)
            analyses.put(store, d.id, result)
            if userview.visible(d):
                userview.refresh(store, [d.uid])
            same_key = before is None or before.get("exact_key") == result.get("exact_key")
            out.append({"id": d.id, "core": result["core"], "state": result["state"],
                        "signature": result.get("signature"), "exact_key": result.get("exact_key"),
                        "exact_key_unchanged": same_key, "debuginfod": report.as_dict()})
            lines.append(f"{d.id}: {result['state']} from the {result['core']} core, "
                         f"{display(result.get('signature') or '-')}; debuginfod: {len(report.fetched)} fetched, "
                         f"{len(report.missing)} missing, {len(report.failed)} failed"
                         + ("" if same_key else "; the exact key changed"))
    emit(args, out, "\n".join(lines))
    return 0

"""The shipped Grafana dashboard and Prometheus alert rules name only metrics the MetricsObserver exports, and
Prometheus's own promtool accepts them (the rules file, its unit tests, and every dashboard expression)."""

from __future__ import annotations

import json
import re
import subprocess
from pathlib import Path

import pytest
import yaml

from corehandler.observe import upload_metrics
from corehandler.observe.metrics import MetricsObserver
from corehandler.store import analyses, upload_queue
from corehandler.store.dumprow import row_from_record
from corehandler.store.index import Store

ROOT = Path(__file__).resolve().parents[2]
DASHBOARD = ROOT / "packaging/grafana/corehandler-dashboard.json"
RULES = ROOT / "packaging/prometheus/corehandler-alerts.yml"
RULES_TEST = ROOT / "packaging/prometheus/corehandler-alerts.test.yml"

# Prometheus's own series, not ours.
BUILTIN = {"up"}
KEYWORDS = {"by", "without", "on", "ignoring", "group_left", "group_right", "bool", "and", "or", "unless",
            "offset", "inf", "nan"}
# Grafana's variables, replaced by what Grafana would put there so promtool can parse the expression.
GRAFANA_VARIABLES = {"$__rate_interval": "5m", "$__range_s": "86400", "$__range": "1d", "$__interval": "1m",
                     "$instance": ".*"}


def metric_names(expr: str) -> set[str]:
    """The series an expression selects: identifiers outside strings, label matchers, ranges and grouping
    clauses that are neither keywords nor function calls."""
    e = re.sub(r'"(?:[^"\\]|\\.)*"', '""', expr)
    e = re.sub(r"\$\w+", " 1 ", e)  # Grafana's variables ($__range): values, not series
    e = re.sub(r"\{[^}]*\}", " ", e)
    e = re.sub(r"\[[^\]]*\]", " ", e)
    e = re.sub(r"\boffset\s+-?\w+", " ", e)  # offset 30m: a duration, not a series
    e = re.sub(r"\b(by|without|on|ignoring|group_left|group_right)\s*\([^)]*\)", " ", e)
    e = re.sub(r"(?<![\w:])\d+(\.\d+)?([eE][+-]?\d+)?", " ", e)
    names = set()
    for match in re.finditer(r"[A-Za-z_:][A-Za-z0-9_:]*", e):
        if re.match(r"\s*\(", e[match.end():]) or match.group() in KEYWORDS:
            continue
        names.add(match.group())
    return names


def dashboard_exprs() -> list[str]:
    exprs = []

    def walk(node):
        if isinstance(node, dict):
            if isinstance(node.get("expr"), str):
                exprs.append(node["expr"])
            for value in node.values():
                walk(value)
        elif isinstance(node, list):
            for value in node:
                walk(value)

    dashboard = json.loads(DASHBOARD.read_text())
    walk(dashboard["panels"])
    for variable in dashboard["templating"]["list"]:
        query = variable.get("definition", "")
        # label_values(metric, label): only the first argument is a series.
        match = re.fullmatch(r"label_values\((\w+),\s*\w+\)", query)
        if match:
            exprs.append(match.group(1))
    return exprs


def rule_exprs() -> list[str]:
    rules = yaml.safe_load(RULES.read_text())
    return [rule["expr"] for group in rules["groups"] for rule in group["rules"]]


def exported_names(tmp_path: Path) -> set[str]:
    """Every sample name the observer exports once each kind of event has happened."""
    observer = MetricsObserver(state_dir=tmp_path, store_limit_bytes=lambda: 1 << 30,
                               capture_probe=lambda: {"mode": "socket", "listening": True, "refused_peers": 1,
                                                      "stalled": 1, "shed": {1000: 3}})
    with Store(tmp_path) as store:  # a stored dump and a deleted one: the series read from the index
        for n in (1, 2):
            store.insert(row_from_record({"id": f"{n}-0123456789abcdef-{n}", "timestamp": n}, status="ok",
                                         problem=None, path=None, raw_bytes=10, stored_bytes=5, sha256=None))
        store.delete(store.get("1-0123456789abcdef-1"), "max_age")
        analyses.put(store, "2-0123456789abcdef-2", {"state": "ok", "signature": "x: SIGSEGV in f",
                                                      "signature_id": "s1-0123"})
    record = {"signal": 11, "timestamp": 1, "proc": {"exe": "/bin/x"},
              "capture": {"bytes": 10, "drained_bytes": 0, "ns": 1000, "throughput_bytes_per_second": 1e7,
                          "complete": True}, "handler": {"started_realtime_ns": 1}}
    observer.on_ingested(record, {"raw_bytes": 10, "stored_bytes": 5, "compress_seconds": 0.1,
                                  "ingest_seconds": 0.2, "status": "ok"})
    observer.on_error("ingest", "boom", None)
    observer.socket_rejects.labels("max_pending").inc()  # what a record csplice refused over the socket counts
    observer.on_state(1, 2, 3)
    # The upload queue's metrics, which serve adds to the same registry when [upload] is set.
    with Store(tmp_path / "state") as store:
        upload_queue.ensure_schema(store.db)
    observer.registry.register(upload_metrics.UploadCollector(tmp_path / "state" / "index.sqlite"))
    return {sample.name for family in observer.registry.collect() for sample in family.samples}


def test_metric_name_extraction():
    assert metric_names('sum by (le, instance) (rate(a_bucket{x="y{z}"}[5m])) / on (i) b_total > 1e6') == \
        {"a_bucket", "b_total"}
    assert metric_names("histogram_quantile(0.99, c) * 60") == {"c"}
    assert metric_names("sum(d offset 30m) > e") == {"d", "e"}


@pytest.mark.parametrize("source", ["dashboard", "rules"])
def test_expressions_name_only_exported_metrics(source, tmp_path):
    exprs = dashboard_exprs() if source == "dashboard" else rule_exprs()
    used = set().union(*(metric_names(e) for e in exprs))
    exported = exported_names(tmp_path)
    assert len(exprs) >= 10 and "corehandler_dumps_total" in used
    assert used - exported - BUILTIN == set()


@pytest.mark.prometheus
def test_promtool_checks_and_unit_tests_the_rules():
    check = subprocess.run(["promtool", "check", "rules", str(RULES)], capture_output=True, text=True)
    assert check.returncode == 0, check.stdout + check.stderr
    count = sum(len(group["rules"]) for group in yaml.safe_load(RULES.read_text())["groups"])
    assert count >= 16 and f"SUCCESS: {count} rules found" in check.stdout
    test = subprocess.run(["promtool", "test", "rules", str(RULES_TEST)], capture_output=True, text=True,
                          cwd=RULES_TEST.parent)
    assert test.returncode == 0, test.stdout + test.stderr


@pytest.mark.prometheus
def test_promtool_parses_every_dashboard_expression(tmp_path):
    rules = []
    for i, expr in enumerate(dashboard_exprs()):
        for variable, value in GRAFANA_VARIABLES.items():
            expr = expr.replace(variable, value)
        rules.append({"record": f"dashboard:expr_{i}", "expr": expr})
    path = tmp_path / "dashboard-exprs.yml"
    path.write_text(yaml.safe_dump({"groups": [{"name": "dashboard", "rules": rules}]}))
    check = subprocess.run(["promtool", "check", "rules", str(path)], capture_output=True, text=True)
    assert check.returncode == 0, check.stdout + check.stderr


def test_every_alert_has_a_runbook_section():
    runbook = (ROOT / "docs/runbook.md").read_text()
    anchors = {line[3:].strip().lower() for line in runbook.splitlines() if line.startswith("## ")}
    rules = yaml.safe_load(RULES.read_text())
    for rule in (r for group in rules["groups"] for r in group["rules"]):
        url = rule["annotations"]["runbook_url"]
        assert url == f"file:///usr/share/corehandler/runbook.md#{rule['alert'].lower()}"
        assert rule["alert"].lower() in anchors, rule["alert"]

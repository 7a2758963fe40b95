"""`fleet report` through the real S3 server: the data (`--json`) and the page a person opens, rendered by
headless Chromium with no network: what it shows, a screenshot in the test's artifacts, no console error."""

from __future__ import annotations

import datetime as dt
import json
import shutil
import subprocess

import pytest

from corehandler.fleet import bucket as layout
from support.fleethost import Host
from support.fleetrows import put_sidecar, sidecar

pytestmark = pytest.mark.s3

LAST = dt.date(2025, 11, 24)
EVIL = "svc SIGABRT <script>alert(1)</script> \x1b[31m"


def _dump(host: str, n: int, signature: str, day: dt.date, core: bool = True, exe: str = "/usr/bin/app") -> dict:
    sc = sidecar(host, n, signature, core=core)
    at = dt.datetime.combine(day, dt.time(12), dt.timezone.utc).timestamp() + n
    dump_id = f"{int(at * 1e6)}-0123456789abcdef-{n}"
    sc.update(id=dump_id, crashed_at=at, uploaded_at=at + 1)
    sc["index"]["exe"] = exe
    if core:
        sc["core"]["key"] = f"k/{dump_id}.zst"
    return sc


@pytest.fixture
def fleet(tmp_path, s3):
    bucket = s3.new_bucket()
    alpha = Host(tmp_path, s3, bucket, "alpha")
    client, target = s3.client(), layout.Target(bucket, "fleet", "alpha")
    d2, d1 = LAST - dt.timedelta(days=2), LAST - dt.timedelta(days=1)
    dumps = [_dump("h1", 1, "app SIGSEGV parse", d2), _dump("h1", 2, "app SIGSEGV parse", d2),
             _dump("h1", 3, "app SIGSEGV parse", LAST), _dump("h2", 4, "app SIGSEGV parse", LAST),
             _dump("h2", 5, "app SIGSEGV parse", LAST),
             _dump("h3", 6, EVIL, d1, exe="/opt/\x1bsvc"), _dump("h3", 7, EVIL, LAST, core=False)]
    for sc in dumps:
        put_sidecar(client, target, sc)
    return alpha


def test_report_data_counts_each_signature_per_day_and_marks_the_new(fleet, capsys):
    code, out, err = fleet.cli(capsys, "--json=short", "fleet", "report", "--date", str(LAST), "--days", "3",
                               "--new-since", str(LAST - dt.timedelta(days=1)))
    assert code == 0, err
    data = json.loads(out)
    top, evil = data["signatures"]
    assert (top["signature"], top["count"], top["per_day"], top["host_count"], top["new"]) == \
        ("app SIGSEGV parse", 5, [2, 0, 3], 2, False)
    assert (evil["signature"], evil["count"], evil["per_day"], evil["without_core"], evil["new"]) == \
        (EVIL, 2, [0, 1, 1], 1, True)
    assert data["totals"] == {"dumps": 7, "hosts": 3, "signatures": 2, "without_core": 1}
    assert data["per_day"] == [2, 1, 4]
    assert evil["get"].startswith("corehandler fleet get ") and "--host h3" in evil["get"]
    # A window that does not reach back before --new-since cannot call anything new, and says so.
    code, out, _ = fleet.cli(capsys, "--json=short", "fleet", "report", "--date", str(LAST), "--days", "1",
                             "--new-since", str(LAST))
    assert code == 0 and not json.loads(out)["new_judged"]
    assert not any(s["new"] for s in json.loads(out)["signatures"])


@pytest.mark.skipif(not shutil.which("chromium"), reason="needs Debian's chromium (scripts/apt/test.txt)")
def test_the_page_shows_the_fleet_in_a_browser_without_network_or_script(fleet, capsys, tmp_path,
                                                                        request):
    page = tmp_path / "report.html"
    code, _, err = fleet.cli(capsys, "fleet", "report", "--date", str(LAST), "--days", "3", "--new-since",
                             str(LAST - dt.timedelta(days=1)), "-o", str(page))
    assert code == 0, err
    text = page.read_text()
    assert "<script" not in text and "\x1b" not in text  # a process's name never becomes markup or an escape
    assert "&lt;script&gt;alert(1)&lt;/script&gt; \\x1b[31m" in text
    assert "http://" not in text and "https://" not in text  # nothing to fetch: the file is the whole page

    shot = tmp_path / "report.png"
    browser = ["chromium", "--headless", "--no-sandbox", "--disable-gpu", "--no-first-run",
               "--disable-background-networking", "--disable-component-update", "--disable-sync",
               f"--user-data-dir={tmp_path / 'profile'}", "--enable-logging=stderr", "--v=0",
               "--window-size=1400,900"]
    run = subprocess.run(browser + [f"--screenshot={shot}", page.as_uri()], capture_output=True, text=True,
                         timeout=120)
    assert run.returncode == 0 and shot.stat().st_size > 10_000, run.stderr
    assert "CONSOLE" not in run.stderr, run.stderr  # no console message, let alone an error
    artifacts = request.config.rootpath / "test-artifacts"
    artifacts.mkdir(exist_ok=True)
    shutil.copy(shot, artifacts / "fleet-report.png")

    # What a person reads: the rendered page's text, in the browser's order.
    dom = subprocess.run(browser + ["--dump-dom", page.as_uri()], capture_output=True, text=True, timeout=120)
    assert dom.returncode == 0, dom.stderr
    shown = dom.stdout
    assert "Top crashers, 2025-11-22 – 2025-11-24 (UTC)" in shown
    assert "7 dumps from 3 hosts, 2 signatures" in shown
    assert shown.index("app SIGSEGV parse") < shown.index("&lt;script&gt;")  # most frequent first
    assert shown.count('class="new"') == 2  # the legend's badge and the new signature's
    assert "<svg" in shown and "<title>2025-11-24: 3</title>" in shown

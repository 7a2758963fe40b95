"""`fleet report`: the fleet at a glance, as Socorro's "top crashers" shows it: one self-contained HTML page (no
server, no network, no script; the plots are inline SVG) and the same data as JSON.

Built on the fleet view (fleetview.py): two queries on the embedded engine over the days asked for, so it
scales as `fleet list --group` does. Per signature: the count, a bar per day of the window, first and last
seen within the window, the hosts and executables, the share kept as metadata only (no core in the bucket:
the fleet budget, the host's limits), and the `fleet get` command of its latest dump. A v2 signature
counts the dumps of the v1 signatures it links (fleetview.link). "New" is a signature first seen on or
after --new-since (a release's date) while the window reaches back before it; without the window reaching
back, nothing can be called new and the page says so.

Every value on the page is another host's word or a crashed process's name: each goes through the one escaper
(printable.display) and then HTML's.
"""

from __future__ import annotations

import datetime as dt
import html
from collections.abc import Sequence

from corehandler import __version__
from corehandler.fleet.fleetview import link
from corehandler.printable import display

# Over `linked` (fleetview.link): a v2 signature counts the dumps of the v1 signature it links, so one of
# before an upgrade makes it not new.
TOP_SQL = """
SELECT coalesce(signature, '(none)') AS signature, any_value(signature_id) AS signature_id, count(*) AS count,
       count(*) FILTER (WHERE has_core) AS cores, count(DISTINCT host) AS host_count,
       list_sort(list(DISTINCT host))[1:5] AS hosts, count(DISTINCT exe) AS exe_count,
       arg_min(coalesce(exe, comm), crashed_at) AS exe, min(epoch_us(crashed_at)) / 1e6 AS first_seen,
       max(epoch_us(crashed_at)) / 1e6 AS last_seen, arg_max(id, crashed_at) AS latest,
       arg_max(host, crashed_at) AS latest_host,
       list_sort(list(DISTINCT signature_v1_id) FILTER (WHERE signature_v1_id IS NOT NULL)) AS signature_v1_ids,
       count(*) FILTER (WHERE own_signature_id IS DISTINCT FROM signature_id) AS linked_v1
FROM linked GROUP BY 1 ORDER BY count DESC, signature LIMIT ?"""
DAILY_SQL = """
SELECT coalesce(signature, '(none)') AS signature, CAST(crashed_at AS DATE) AS day, count(*) AS count
FROM linked WHERE list_contains(?, coalesce(signature, '(none)')) GROUP BY 1, 2"""
TOTALS_SQL = """
SELECT count(*) AS dumps, count(DISTINCT host) AS hosts, count(DISTINCT coalesce(signature, '(none)'))
       AS signatures, count(*) FILTER (WHERE NOT has_core) AS without_core FROM linked"""
FLEET_DAILY_SQL = "SELECT CAST(crashed_at AS DATE) AS day, count(*) AS count FROM dumps GROUP BY 1"


def collect(con, days: Sequence[dt.date], top: int, new_since: dt.date | None, source: str,
            skipped: Sequence[str] = ()) -> dict:
    """The report's data: what `--json` prints and the page shows."""
    def query(sql: str, *params) -> list[dict]:
        cur = con.execute(sql, list(params))
        names = [d[0] for d in cur.description]
        return [dict(zip(names, row)) for row in cur.fetchall()]

    link(con)
    [totals] = query(TOTALS_SQL)
    signatures = query(TOP_SQL, top)
    per_day: dict[str, dict[dt.date, int]] = {}
    for r in query(DAILY_SQL, [s["signature"] for s in signatures]) if signatures else []:
        per_day.setdefault(r["signature"], {})[r["day"]] = r["count"]
    fleet_daily = {r["day"]: r["count"] for r in query(FLEET_DAILY_SQL)}
    judged = new_since is not None and days[0] < new_since
    for s in signatures:
        counts = per_day.get(s["signature"], {})
        s["per_day"] = [counts.get(d, 0) for d in days]
        s["without_core"] = s["count"] - s["cores"]
        s["new"] = bool(judged and s["first_seen"] >= _midnight(new_since))
        s["get"] = f"corehandler fleet get {s['latest']} --host {s['latest_host']} -o {s['latest']}.core"
    return {"source": source, "days": [d.isoformat() for d in days], "new_since": _iso(new_since),
            "new_judged": judged, "totals": totals, "per_day": [fleet_daily.get(d, 0) for d in days],
            "signatures": signatures, "skipped": list(skipped), "generated_at": dt.datetime.now(dt.timezone.utc)
            .strftime("%Y-%m-%d %H:%M:%S UTC"), "version": __version__}


def _midnight(day: dt.date) -> float:
    return dt.datetime.combine(day, dt.time(), dt.timezone.utc).timestamp()


def _iso(day: dt.date | None) -> str | None:
    return day.isoformat() if day else None


def _text(value) -> str:
    """A value as the page shows it: escaped for a terminal's reader first (the one escaper), then for HTML."""
    return html.escape(display("-" if value is None else str(value)))


def _when(ts: float | None) -> str:
    return "-" if ts is None else dt.datetime.fromtimestamp(ts, dt.timezone.utc).strftime("%Y-%m-%d %H:%M")


def _linked(s: dict) -> str:
    """The v1 signatures a v2 one links, as the page says them (and how many of its dumps were theirs)."""
    if not s["linked_v1"]:
        return ""
    ids = ", ".join(_text(i) for i in s["signature_v1_ids"][:3]) + (" ..." if len(s["signature_v1_ids"]) > 3 else "")
    return f"; v1: {ids} ({s['linked_v1']} of its dumps)"


BAR, GAP, HEIGHT = 6, 2, 28
NEW = '<span class="new">new</span>'


def bars(counts: Sequence[int], days: Sequence[str], label: str, height: int = HEIGHT, cls: str = "bars") -> str:
    """An inline SVG bar per day, scaled to the largest; each bar's title names its day and count."""
    top = max(counts, default=0) or 1
    width = len(counts) * (BAR + GAP)
    out = [f'<svg class="{cls}" width="{width}" height="{height}" viewBox="0 0 {width} {height}" role="img" '
           f'aria-label="{_text(label)}">']
    for i, (n, day) in enumerate(zip(counts, days)):
        h = max(1, round(n / top * (height - 1))) if n else 0
        out.append(f'<rect x="{i * (BAR + GAP)}" y="{height - h}" width="{BAR}" height="{h}">'
                   f'<title>{_text(day)}: {n}</title></rect>' if n else
                   f'<rect class="zero" x="{i * (BAR + GAP)}" y="{height - 1}" width="{BAR}" height="1"/>')
    out.append("</svg>")
    return "".join(out)


STYLE = """
body { font: 14px/1.4 system-ui, sans-serif; margin: 1.5em; color: #1b1b1b; }
h1 { font-size: 1.4em; margin: 0 0 .3em; }
p.summary { margin: 0 0 1em; color: #444; }
table { border-collapse: collapse; width: 100%; }
th, td { text-align: left; padding: .35em .6em; border-bottom: 1px solid #ddd; vertical-align: top; }
th { background: #f3f3f3; position: sticky; top: 0; }
td.n { text-align: right; font-variant-numeric: tabular-nums; }
code { font: 12px/1.3 ui-monospace, monospace; word-break: break-all; }
svg.bars rect { fill: #c0392b; } svg.bars rect.zero { fill: #ccc; }
svg.total rect { fill: #34495e; }
.new { background: #f1c40f; color: #000; border-radius: 3px; padding: 0 .3em; font-size: .8em; font-weight: 600; }
.skipped { color: #8a5a00; }
"""


def page(data: dict) -> str:
    """The report as one HTML document."""
    days, totals = data["days"], data["totals"]
    window = days[0] if len(days) == 1 else f"{days[0]} – {days[-1]}"
    share = f"{totals['without_core'] / totals['dumps']:.0%}" if totals["dumps"] else "0%"
    if data["new_since"] is None:
        newness = "Give --new-since DATE (a release's day) to mark signatures first seen since then."
    elif data["new_judged"]:
        newness = f"{NEW}: first seen on or after {_text(data['new_since'])}."
    else:
        newness = (f"The window starts on {_text(days[0])}, not before {_text(data['new_since'])}: whether a "
                   "signature is new cannot be told; read more --days.")
    rows = []
    for rank, s in enumerate(data["signatures"], 1):
        hosts = ", ".join(_text(h) for h in s["hosts"]) + (f" and {s['host_count'] - len(s['hosts'])} more"
                                                          if s["host_count"] > len(s["hosts"]) else "")
        exes = _text(s["exe"]) + (f" and {s['exe_count'] - 1} more" if s["exe_count"] > 1 else "")
        rows.append(
            f"<tr><td class=\"n\">{rank}</td><td><code>{_text(s['signature'])}</code>"
            f"{' ' + NEW if s['new'] else ''}<br><small>{_text(s['signature_id'])}{_linked(s)}"
            f"</small></td><td class=\"n\">{s['count']}</td><td>{bars(s['per_day'], days, s['signature'])}</td>"
            f"<td>{_when(s['first_seen'])}</td><td>{_when(s['last_seen'])}</td>"
            f"<td class=\"n\">{s['host_count']}</td><td>{hosts}</td><td>{exes}</td>"
            f"<td class=\"n\">{s['without_core']}</td><td><code>{_text(s['get'])}</code></td></tr>")
    skipped = "".join(f"<li>{_text(why)}</li>" for why in data["skipped"])
    return f"""<!doctype html>
<html lang="en"><head><meta charset="utf-8">
<meta name="viewport" content="width=device-width, initial-scale=1">
<title>corehandler fleet report, {_text(window)}</title>
<style>{STYLE}</style></head>
<body>
<h1>Top crashers, {_text(window)} (UTC)</h1>
<p class="summary">{totals['dumps']} dumps from {totals['hosts']} hosts, {totals['signatures']} signatures;
{share} kept as metadata only. Read from {_text(data['source'])} by corehandler {_text(data['version'])} at
{_text(data['generated_at'])}. {newness}</p>
<p>All dumps per day: {bars(data['per_day'], days, 'all dumps per day', 40, 'total')}</p>
<table>
<thead><tr><th>#</th><th>Signature</th><th>Dumps</th><th>Per day</th><th>First seen</th><th>Last seen</th>
<th>Hosts</th><th>Host names</th><th>Executable</th><th>Metadata only</th><th>Latest dump</th></tr></thead>
<tbody>
{chr(10).join(rows) if rows else '<tr><td colspan="11">No dumps in this window.</td></tr>'}
</tbody></table>
{f'<h2>Left out</h2><ul class="skipped">{skipped}</ul>' if skipped else ''}
</body></html>
"""

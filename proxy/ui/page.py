"""HTML of the forensic map: the session list (`/ui/`) and one session's map (`/ui/sessions/{id}`,
`promptcache explain --html`).

Every page is one self-contained document: the stylesheet (`map.css`) and the divider's script
(`map.js`) are inlined, the request rows, the block map and the plot are rendered here as HTML and
SVG, and the figures the divider needs travel as JSON in `<script type="application/json">`.
Nothing is loaded from the network (no CDN, no web fonts): the page works offline, and
`CONTENT_SECURITY_POLICY` (sent with every served page) forbids any fetch.

Markup a test can hold: each request row is `<tr data-request="N">`, each divergence carries
`data-cause="..."`, the divider is `#pc-divider` (`role="slider"`: arrow keys, Home / End,
PageUp / PageDown, or drag), the figures `#pc-cached`, `#pc-tail`, `#pc-cost`, `#pc-baseline`,
`#pc-saving` hold their exact value in `data-value`.

Page data (`session_view`, `pair_view`) is a plain dict: `title`, `subtitle`, `prices` (a
`rules/pricing.yaml` row or `None`), `tail_ttl`, `blocks` (`MapBlock`s), `rows` (`RequestRow`s),
`chosen` (map index the divider starts on) and `estimated` (rows without upstream usage).
"""

from __future__ import annotations

import datetime
import functools
import html
from collections.abc import Sequence
from pathlib import Path
from typing import Any, Final
from urllib.parse import quote

import orjson

from proxy.history import MapBlock, RequestRow, SessionEntry
from proxy.pricing import Prices
from proxy.whatif import tail_price

_HERE: Final = Path(__file__).parent
META_POLICY: Final = (
    "default-src 'none'; style-src 'unsafe-inline'; script-src 'unsafe-inline'; img-src data:; "
    "base-uri 'none'; form-action 'none'"
)
"""The policy every page carries in a `<meta>` too, so a map saved to a file (`promptcache
explain --html`) is held to it when opened from disk."""
CONTENT_SECURITY_POLICY: Final = META_POLICY + "; frame-ancestors 'none'"
"""The header `proxy.ui.routes` sends: the same, and `frame-ancestors`, which a `<meta>` cannot
carry (https://www.w3.org/TR/CSP3/#directive-frame-ancestors)."""
_SECTION_LABEL: Final = {"tools": "tools", "system": "system", "messages": "messages"}


@functools.cache
def _asset(name: str) -> str:
    return (_HERE / name).read_text(encoding="utf-8")


def _e(value: Any) -> str:
    return html.escape("" if value is None else str(value), quote=True)


def _json_script(data: Any) -> str:
    """JSON safe inside `<script>`: every `<` is escaped (`\\u003c`), so no `</script>` can occur."""
    return orjson.dumps(data).decode().replace("<", "\\u003c")


def _usd(value: float | None) -> str:
    return "-" if value is None else f"${value:.6f}"


def _pct(ratio: float | None) -> str:
    """A share as a percentage, `-` when unknown (no usage seen: `SessionEntry.hit_ratio`)."""
    return "-" if ratio is None else f"{ratio * 100:.1f}%"


def _time(epoch: float) -> str:
    if not epoch:
        return "-"
    return datetime.datetime.fromtimestamp(epoch, datetime.UTC).strftime("%H:%M:%S")


def _document(title: str, body: str) -> str:
    return (
        '<!doctype html><html lang="en"><head><meta charset="utf-8">'
        f'<meta http-equiv="Content-Security-Policy" content="{META_POLICY}">'
        '<meta name="viewport" content="width=device-width, initial-scale=1">'
        f'<title>{_e(title)}</title><link rel="icon" href="data:,"><style>{_asset("map.css")}</style></head>'
        f"<body>{body}</body></html>"
    )


# --- the session list --------------------------------------------------------------------------


def index_page(entries: Sequence[SessionEntry], token_query: str = "") -> str:
    """`/ui/`: recent sessions, newest first. `token_query` (`?token=...` or empty) is appended
    to the links so a token given in the URL carries over."""
    rows = []
    for entry in entries:
        link = f"sessions/{quote(entry.session_id, safe='')}?tenant={entry.tenant[:8]}"
        if token_query:
            link += "&" + token_query.lstrip("?")
        s = entry.summary()
        cause = s["last_cause"] or "-"
        rows.append(
            "<tr>"
            f'<td class="l"><code>{_e(s["tenant"])}</code></td>'
            f'<td class="l"><a href="{_e(link)}"><code>{_e(entry.session_id)}</code></a></td>'
            f'<td class="l">{_e(entry.provider)} <span class="note">{_e(s["model"])}</span></td>'
            f"<td>{s['requests']}</td><td>{_pct(s['hit_ratio'])}</td>"
            f"<td>{_usd(s['savings_usd'])}</td>"
            f'<td class="l"><span class="cause cause-{_e(cause)}" data-cause="{_e(cause)}">{_e(cause)}</span></td>'
            f"<td>{_time(entry.last_seen)}</td></tr>"
        )
    table = (
        '<table id="pc-sessions"><thead><tr><th class="l">tenant</th><th class="l">session</th>'
        '<th class="l">provider</th><th>requests</th><th>hit ratio</th><th>savings</th>'
        '<th class="l">last cause</th><th>last seen (UTC)</th></tr></thead><tbody>' + "".join(rows) + "</tbody></table>"
    )
    if not rows:
        table += '<p class="note">No session measured yet: send a request through the proxy.</p>'
    body = (
        "<h1>promptcache: recent sessions</h1>"
        '<div class="meta">Newest first. Hit ratio = tokens read from the cache / prompt tokens; '
        "savings = the cost without caching minus the cost (rules/pricing.yaml list prices).</div>" + table
    )
    return _document("promptcache sessions", body)


# --- one session's map -------------------------------------------------------------------------


def _map_index(blocks: Sequence[MapBlock], original: int) -> int:
    """Map position of original block `original` (blocks merge only past `MAX_MAP_BLOCKS`)."""
    seen = 0
    for i, block in enumerate(blocks):
        seen += block.blocks
        if original < seen:
            return i
    return max(0, len(blocks) - 1)


def default_chosen(blocks: Sequence[MapBlock], rows: Sequence[RequestRow]) -> int:
    """Where the divider starts: the newest divergence inside the prompt, else the first volatile
    system block, else the last system block, else block 0."""
    for row in reversed(rows):
        if row.section != "none":
            return _map_index(blocks, row.block)
    for i, block in enumerate(blocks):
        if block.tier == "volatile":
            return i
    system = [i for i, b in enumerate(blocks) if b.section == "system"]
    return system[-1] if system else 0


def tail_ttl(blocks: Sequence[MapBlock]) -> str | None:
    """TTL of the last marker of the map (the tail is written with it), `None` without markers."""
    return next((b.ttl for b in reversed(blocks) if b.ttl), None)


def session_view(entry: SessionEntry) -> dict[str, Any]:
    """Page data of one live session (module docstring)."""
    rows = list(entry.rows)
    blocks = list(entry.blocks)
    model = rows[-1].model if rows else ""
    return {
        "title": f"session {entry.session_id}",
        "subtitle": f"tenant {entry.tenant[:8]} · {entry.provider} {entry.path} · {model} · "
        f"{entry.requests} requests, hit ratio {_pct(entry.hit_ratio)}, savings {_usd(entry.savings_usd)}",
        "prices": entry.prices,
        "family": rows[-1].family if rows else "",
        "tail_ttl": tail_ttl(blocks),
        "blocks": blocks,
        "rows": rows,
        "chosen": default_chosen(blocks, rows),
        "estimated": False,
    }


def _block_class(block: MapBlock) -> str:
    if block.section == "tools":
        return "s-tools"
    if block.section == "system":
        return f"t-{block.tier or 'stable'}"
    role = block.role if block.role in ("user", "assistant", "tool") else "other"
    return f"r-{role}"


def _block_title(i: int, block: MapBlock) -> str:
    parts = [f"block {i}", block.section]
    if block.tier:
        parts.append(block.tier)
    if block.role:
        parts.append(block.role)
    if block.message is not None:
        parts.append(f"message {block.message}")
    parts.append(block.kind)
    if block.blocks > 1:
        parts.append(f"{block.blocks} blocks merged")
    parts.append(f"~{block.tokens:,} tokens")
    if block.ttl:
        parts.append(f"marker ttl {block.ttl}")
    return " · ".join(parts)


def _map_html(blocks: Sequence[MapBlock], divergence: int | None) -> str:
    total = sum(b.tokens for b in blocks) or 1
    cells = []
    for i, block in enumerate(blocks):
        width = block.tokens / total * 100
        classes = f"blk {_block_class(block)}" + (" div" if i == divergence else "")
        mark = f'<div class="mark"><span>{_e(block.ttl)}</span></div>' if block.ttl else ""
        cells.append(
            f'<div class="{classes}" data-block="{i}" data-section="{block.section}"'
            f"{' data-tier=' + chr(34) + block.tier + chr(34) if block.tier else ''}"
            f"{' data-ttl=' + chr(34) + _e(block.ttl) + chr(34) if block.ttl else ''}"
            f' style="width:{width:.4f}%" title="{_e(_block_title(i, block))}">{mark}</div>'
        )
    divider = (
        '<div id="pc-divider" class="divider" role="slider" tabindex="0" '
        'aria-label="move the chosen block after this block"></div>'
    )
    return f'<div class="map-wrap"><div class="map" id="pc-map">{"".join(cells)}{divider}</div></div>'


def _legend() -> str:
    items = [
        ("var(--tools)", "tools"),
        ("var(--stable)", "system: stable"),
        ("var(--session)", "system: session"),
        ("var(--volatile)", "system: volatile"),
        ("var(--user)", "user"),
        ("var(--assistant)", "assistant"),
        ("#111", "marker (TTL)"),
        ("#1f6feb", "divider"),
    ]
    return (
        '<div class="legend">' + "".join(f'<span><i style="background:{c}"></i>{t}</span>' for c, t in items) + "</div>"
    )


def _rows_html(rows: Sequence[RequestRow], estimated: bool) -> str:
    out = []
    for row in rows:
        share = row.read / row.prompt_usage if row.prompt_usage else 0.0
        where = "-"
        if row.section != "none":
            where = (
                f"block {row.block} <code>{_e(row.field_path or row.block_path or '')}</code>"
                f'<br><span class="note">~{row.tokens_before:,} tokens before it</span>'
            )
        elif row.cause == "none":
            where = f'<span class="note">appends after ~{row.tokens_before:,} tokens</span>'
        excerpt = ""
        if row.after is not None:
            before = _e(row.before) if row.before is not None else "<i>(not kept)</i>"
            excerpt = (
                f'<div class="x"><span class="note">before</span> <span data-side="before">{before}</span></div>'
                f'<div class="x"><span class="note">now</span> <span data-side="now">{_e(row.after)}</span></div>'
            )
        out.append(
            f'<tr data-request="{row.n}"><td>{row.n}</td><td>{_time(row.at)}</td>'
            f"<td>{row.read:,}</td><td>{row.write_5m:,}</td><td>{row.write_1h:,}</td><td>{row.uncached:,}</td>"
            f"<td>{share * 100:.1f}%</td><td>{_usd(row.cost_usd)}</td>"
            f'<td class="l"><span class="cause cause-{_e(row.cause)}" data-cause="{_e(row.cause)}"'
            f' data-section="{_e(row.section)}">{_e(row.cause)}</span></td>'
            f'<td class="l">{where}</td><td class="l">{excerpt}</td></tr>'
        )
    head = (
        '<table id="pc-requests"><thead><tr><th>#</th><th>time (UTC)</th><th>read</th>'
        "<th>written 5m</th><th>written 1h</th><th>uncached</th><th>read share</th><th>cost</th>"
        '<th class="l">cause</th><th class="l">where it diverged</th>'
        '<th class="l">excerpt around the divergence</th></tr></thead><tbody>'
    )
    note = (
        '<p class="note">Token figures are estimates (no upstream usage): read = what the '
        "previous request's markers let this one read.</p>"
        if estimated
        else ""
    )
    return head + "".join(out) + "</tbody></table>" + note


def _plot_svg(rows: Sequence[RequestRow]) -> str:
    """Read share (line, left axis 0-100%) and cost (bars, right axis) per request, as SVG."""
    width, height, pad = 720, 180, 34
    n = len(rows)
    if not n:
        return ""
    costs = [r.cost_usd or 0.0 for r in rows]
    top = max(costs) or 1.0
    step = (width - 2 * pad) / max(n, 1)
    bars, points = [], []
    for i, row in enumerate(rows):
        x = pad + step * i + step / 2
        share = row.read / row.prompt_usage if row.prompt_usage else 0.0
        y = height - pad - share * (height - 2 * pad)
        h = costs[i] / top * (height - 2 * pad)
        bars.append(
            f'<rect x="{x - step * 0.3:.1f}" y="{height - pad - h:.1f}" width="{step * 0.6:.1f}" '
            f'height="{h:.1f}" fill="#c9d3e6" data-cost="{costs[i]!r}"><title>request {row.n}: '
            f"{_usd(row.cost_usd)}</title></rect>"
        )
        points.append((x, y, row, share))
    line = " ".join(f"{x:.1f},{y:.1f}" for x, y, _, _ in points)
    dots = "".join(
        f'<circle cx="{x:.1f}" cy="{y:.1f}" r="3" fill="#3f8f5a" data-share="{share!r}">'
        f"<title>request {row.n}: {share * 100:.1f}% read</title></circle>"
        for x, y, row, share in points
    )
    labels = "".join(
        f'<text x="{x:.1f}" y="{height - pad + 14}" text-anchor="middle">{row.n}</text>' for x, _, row, _ in points
    )
    axes = (
        f'<line x1="{pad}" y1="{height - pad}" x2="{width - pad}" y2="{height - pad}" stroke="#999"/>'
        f'<text x="4" y="{pad + 4}">100%</text><text x="4" y="{height - pad}">0%</text>'
        f'<text x="{width - pad + 2}" y="{pad + 4}">${top:.4f}</text>'
        f'<text x="{pad}" y="14">read share (line) and cost (bars) per request</text>'
    )
    return (
        f'<svg id="pc-plot" class="plot" width="{width}" height="{height}" viewBox="0 0 {width} {height}" '
        f'role="img" aria-label="read share and cost per request">{axes}{"".join(bars)}'
        f'<polyline points="{line}" fill="none" stroke="#3f8f5a" stroke-width="2"/>{dots}{labels}</svg>'
    )


def _chosen_select(blocks: Sequence[MapBlock], chosen: int) -> str:
    options = []
    for i, block in enumerate(blocks):
        label = _block_title(i, block)
        selected = " selected" if i == chosen else ""
        options.append(f'<option value="{i}"{selected}>{_e(label)}</option>')
    return f'<select id="pc-chosen" aria-label="block to move">{"".join(options)}</select>'


def session_page(view: dict[str, Any], back_link: str | None = None) -> str:
    """The map page of `view` (`session_view` or `pair_view`), one self-contained document."""
    blocks: list[MapBlock] = list(view["blocks"])
    rows: list[RequestRow] = list(view["rows"])
    chosen = min(max(int(view.get("chosen") or 0), 0), max(len(blocks) - 1, 0))
    prices = view.get("prices")
    divergence = next((_map_index(blocks, r.block) for r in reversed(rows) if r.section != "none"), None)
    data = {
        "tokens": [b.tokens for b in blocks],
        "prices": prices,
        "tail_ttl": view.get("tail_ttl"),
        "chosen": chosen,
    }
    back = f'<a href="{_e(back_link)}">all sessions</a> · ' if back_link else ""
    total = sum(b.tokens for b in blocks)
    price_note = (
        f"Prices: {_e(view.get('family') or '')} cache read ${prices['cache_read']}/M, tail written at "
        f"{_e(view.get('tail_ttl') or 'input (no marker)')} "
        f"(${_tail_rate(prices, view.get('tail_ttl'))}/M), rules/pricing.yaml."
        if prices
        else "No price row for this model: costs are not shown."
    )
    whatif = (
        '<div class="whatif" id="pc-whatif">'
        '<div><small>divider</small><b id="pc-after">-</b></div>'
        '<div><small>cached prefix (tokens)</small><b id="pc-cached">-</b></div>'
        '<div><small>cached share</small><b id="pc-share">-</b></div>'
        '<div><small>recomputed tail (tokens)</small><b id="pc-tail">-</b></div>'
        '<div><small>cost per request</small><b id="pc-cost">-</b></div>'
        '<div><small>cost as sent</small><b id="pc-baseline">-</b></div>'
        '<div><small>saving per request</small><b id="pc-saving">-</b></div>'
        "</div>"
        if prices and blocks
        else ""
    )
    body = (
        f'<div class="meta">{back}promptcache forensic map</div>'
        f'<h1>{_e(view["title"])}</h1><div class="meta">{_e(view.get("subtitle", ""))}</div>'
        f"<h2>Prompt of the newest request, in render order (~{total:,} tokens, {len(blocks)} blocks)</h2>"
        + _legend()
        + _map_html(blocks, divergence)
        + "<h2>What if the chosen block came later?</h2>"
        '<div class="note">Pick a block (click it, or choose it here), then drag the divider or focus it and '
        "use the arrow keys: the block moves to sit after the divider, everything before it is read "
        "from the cache, the rest is recomputed and written again.</div>"
        + (_chosen_select(blocks, chosen) if blocks else "")
        + whatif
        + f'<div class="note">{price_note}</div>'
        + "<h2>Requests</h2>"
        + _rows_html(rows, bool(view.get("estimated")))
        + "<h2>Read share and cost per request</h2>"
        + _plot_svg(rows)
        + f'<script type="application/json" id="pc-data">{_json_script(data)}</script>'
        + f"<script>{_asset('map.js')}</script>"
    )
    return _document(str(view["title"]), body)


def _tail_rate(prices: dict[str, float], ttl: str | None) -> float:
    return tail_price(Prices(**prices), ttl)

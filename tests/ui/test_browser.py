"""The forensic map in a real browser (headless chromium over CDP).

A session is driven through the proxy in front of the simulator; the page is loaded from the
admin listener with the admin token; the DOM holds one row per request with the figures the
simulator answered and the causes measurement found; a screenshot is not blank; the divider,
moved by simulated keys and by a simulated mouse drag, shows exactly what the Python
implementation of the same formula (`proxy.whatif`) computes; without the token the page is
refused; the page fetches nothing but itself.
"""

from __future__ import annotations

import io
import random
from typing import Any

import pytest
from PIL import Image

from proxy.pricing import Prices, default_pricing
from proxy.session_identity import explicit_id
from proxy.whatif import what_if
from tests.ui.cdp import Browser, Page
from tests.ui.conftest import KEY, MODEL, SESSION, TOKEN, drive_session

FIGURES = ("pc-cached", "pc-tail", "pc-cost", "pc-baseline", "pc-saving")


async def _figures(page: Page) -> dict[str, Any]:
    return await page.js(
        f"Object.fromEntries({list(FIGURES)!r}.map(id => [id, Number(document.getElementById(id).dataset.value)]))"
    )


def _expected(tokens: list[int], chosen: int, after: int, prices: Prices, ttl: str | None) -> dict[str, Any]:
    r = what_if(tokens, chosen, after, prices, ttl)
    return {
        "pc-cached": r.cached_tokens,
        "pc-tail": r.tail_tokens,
        "pc-cost": r.cost_usd,
        "pc-baseline": r.baseline_cost_usd,
        "pc-saving": r.saving_usd,
    }


async def _open_map(browser: Browser, admin_url: str) -> Page:
    page = await browser.new_page()
    await page.goto(f"{admin_url}/ui/sessions/{SESSION}?token={TOKEN}")
    return page


async def test_session_map_rows_screenshot_and_offline(admin_proxy, browser: Browser) -> None:
    proxy = await admin_proxy(admin_token=TOKEN, mode="observe")
    usages = await drive_session(proxy.url, turns=4)
    page = await browser.new_page()
    page.log.clear()
    url = f"{proxy.admin_url}/ui/sessions/{SESSION}?token={TOKEN}"
    await page.goto(url)
    rows = await page.js(
        "[...document.querySelectorAll('tr[data-request]')].map(tr => ({n: tr.dataset.request,"
        " cause: tr.querySelector('[data-cause]').dataset.cause,"
        " cells: [...tr.cells].map(td => td.innerText),"
        " excerpt: [...tr.querySelectorAll('[data-side]')].map(x => x.textContent)}))"
    )
    assert [r["n"] for r in rows] == ["1", "2", "3", "4"]
    assert [r["cause"] for r in rows] == ["first_request"] + ["system_volatile_text"] * 3
    for row, usage in zip(rows, usages, strict=True):
        read, write_5m, write_1h, uncached = (int(c.replace(",", "")) for c in row["cells"][2:6])
        assert read == usage["cache_read_input_tokens"]
        assert write_5m == usage["cache_creation"]["ephemeral_5m_input_tokens"]
        assert write_1h == usage["cache_creation"]["ephemeral_1h_input_tokens"]
        assert uncached == usage["input_tokens"]
    # Where and why: the timestamp block, with a short excerpt of each side.
    assert "system[1].text" in rows[1]["cells"][9]
    assert rows[1]["excerpt"] == ["Current time: 2026-12-01T09:00:00Z", "Current time: 2026-12-01T09:01:00Z"]
    assert rows[3]["excerpt"] == ["Current time: 2026-12-01T09:02:00Z", "Current time: 2026-12-01T09:03:00Z"]
    assert rows[0]["excerpt"] == []
    # The map: tools / system by tier / messages, the marker with its TTL.
    blocks = await page.js(
        "[...document.querySelectorAll('#pc-map .blk')].map(b => [b.dataset.section, b.dataset.tier || null,"
        " b.dataset.ttl || null])"
    )
    assert blocks[:2] == [["system", "stable", "5m"], ["system", "volatile", None]]
    assert {b[0] for b in blocks[2:]} == {"messages"}
    # Nothing but the page itself was fetched (no CDN, no fonts, no favicon).
    fetched = [p["request"]["url"] for name, p in page.log if name == "Network.requestWillBeSent"]
    assert fetched == [url]
    png = await page.screenshot()
    image = Image.open(io.BytesIO(png)).convert("RGB")
    assert image.size == (1300, 1000)
    colours = image.getcolors(maxcolors=1 << 20) or []
    background = max(colours)[1]
    painted = sum(count for count, colour in colours if colour != background)
    assert painted > 0.05 * image.size[0] * image.size[1], "screenshot is (nearly) blank"
    stable_green = (0x3F, 0x8F, 0x5A)
    assert any(colour == stable_green for _, colour in colours), "the map's stable system block is not drawn"


async def test_divider_keyboard_and_mouse_match_python(admin_proxy, browser: Browser) -> None:
    proxy = await admin_proxy(admin_token=TOKEN, mode="observe")
    await drive_session(proxy.url, turns=3)
    history = proxy.services.last_measurements
    entry = history.find(explicit_id(SESSION))
    tokens = [b.tokens for b in entry.blocks]
    prices = default_pricing().prices("anthropic", MODEL)
    assert prices is not None
    page = await _open_map(browser, proxy.admin_url)
    # The divider starts on the newest divergence (the timestamp block), order as sent.
    chosen = await page.js("Number(document.getElementById('pc-divider').getAttribute('aria-valuenow'))")
    assert chosen == 1
    assert await _figures(page) == _expected(tokens, 1, 1, prices, "5m")
    # Keyboard: focus the divider with a click-free Tab, then three ArrowRight and one ArrowLeft.
    await page.js("document.getElementById('pc-divider').focus()")
    for _ in range(3):
        await page.key("ArrowRight", "ArrowRight", 39)
    await page.key("ArrowLeft", "ArrowLeft", 37)
    assert await _figures(page) == _expected(tokens, 1, 3, prices, "5m")
    await page.key("End", "End", 35)
    end = _expected(tokens, 1, len(tokens) - 1, prices, "5m")
    assert await _figures(page) == end
    assert end["pc-saving"] > 0 and end["pc-cached"] == sum(tokens) - tokens[1]
    # Mouse: drag the divider back to the boundary after block 2.
    box = await page.js(
        "(() => { const d = document.getElementById('pc-divider').getBoundingClientRect();"
        " const m = document.getElementById('pc-map').getBoundingClientRect();"
        " return {dx: d.left + d.width / 2, dy: d.top + d.height / 2, left: m.left, width: m.width}; })()"
    )
    total = sum(tokens)
    target = box["left"] + box["width"] * sum(tokens[:3]) / total
    await page.drag(box["dx"], box["dy"], target, box["dy"])
    assert await _figures(page) == _expected(tokens, 1, 2, prices, "5m")
    assert await page.js("Number(document.getElementById('pc-divider').getAttribute('aria-valuenow'))") == 2


async def test_page_refused_without_token(admin_proxy, browser: Browser) -> None:
    proxy = await admin_proxy(admin_token=TOKEN)
    await drive_session(proxy.url, turns=1)
    page = await browser.new_page()
    for path in ("/ui/", f"/ui/sessions/{SESSION}", f"/ui/sessions/{SESSION}?token=wrong-token"):
        await page.goto(proxy.admin_url + path)
        status = await page.js("performance.getEntriesByType('navigation')[0].responseStatus")
        text = await page.js("document.body.innerText")
        assert (status, text.strip()) == (401, "promptcache: admin token required"), path
    await page.goto(f"{proxy.admin_url}/ui/?token={TOKEN}")
    assert await page.js("performance.getEntriesByType('navigation')[0].responseStatus") == 200
    listed = await page.js("[...document.querySelectorAll('#pc-sessions tbody tr')].map(tr => tr.innerText)")
    assert len(listed) == 1 and explicit_id(SESSION) in listed[0]
    assert KEY not in await page.js("document.documentElement.outerHTML")


@pytest.mark.parametrize("seed", [1, 2])
async def test_page_formula_agrees_with_python(admin_proxy, browser: Browser, seed: int) -> None:
    """The page's `whatIf` and `proxy.whatif.what_if` on many random inputs: equal to the bit."""
    proxy = await admin_proxy(admin_token=TOKEN)
    await drive_session(proxy.url, turns=1)
    page = await _open_map(browser, proxy.admin_url)
    rng = random.Random(seed)
    table = default_pricing()
    rows = [f.prices for f in table.families] + [p for _, p in table.other]
    cases = []
    for _ in range(400):
        n = rng.randint(1, 60)
        tokens = [rng.choice([0, 1, rng.randint(1, 50), rng.randint(1, 200_000)]) for _ in range(n)]
        chosen = rng.randrange(n)
        after = rng.randint(chosen, n - 1)
        prices = rng.choice(rows)
        ttl = rng.choice(["5m", "1h", None, "bogus"])
        cases.append((tokens, chosen, after, prices, ttl))
    payload = [
        [
            t,
            c,
            a,
            {k: getattr(p, k) for k in ("input", "output", "cache_write_5m", "cache_write_1h", "cache_read")},
            ttl,
        ]
        for t, c, a, p, ttl in cases
    ]
    import orjson

    got = await page.js(f"{orjson.dumps(payload).decode()}.map(x => window.promptcacheWhatIf(...x))")
    for (tokens, chosen, after, prices, ttl), page_result in zip(cases, got, strict=True):
        r = what_if(tokens, chosen, after, prices, ttl)
        assert page_result == {
            "chosen": chosen,
            "after": after,
            "cached_tokens": r.cached_tokens,
            "tail_tokens": r.tail_tokens,
            "cost_usd": r.cost_usd,
            "baseline_cost_usd": r.baseline_cost_usd,
        }

"""`promptcache explain A.json B.json --html FILE`: the map of a pair as one self-contained file."""

from __future__ import annotations

import io
import re
from pathlib import Path
from typing import Any

import orjson

from proxy.explain import explain_command
from proxy.pricing import default_pricing
from proxy.whatif import what_if
from tests.ui.cdp import Browser
from tests.ui.conftest import MODEL, SYSTEM, system_for


def _pair(tmp_path: Path) -> tuple[Path, Path, dict[str, Any]]:
    a = {"model": MODEL, "max_tokens": 8, "system": system_for(0), "messages": [{"role": "user", "content": "hi"}]}
    b = orjson.loads(orjson.dumps(a))
    b["system"] = system_for(1)
    b["messages"] += [{"role": "assistant", "content": "hello"}, {"role": "user", "content": "and </script> then?"}]
    pa, pb = tmp_path / "a.json", tmp_path / "b.json"
    pa.write_bytes(orjson.dumps(a))
    pb.write_bytes(orjson.dumps(b))
    return pa, pb, b


def test_html_file_is_self_contained(tmp_path: Path) -> None:
    pa, pb, _ = _pair(tmp_path)
    out = tmp_path / "map.html"
    text = io.StringIO()
    assert explain_command(str(pa), str(pb), out=text, html_path=str(out)) == 1
    assert text.getvalue().endswith(f"B does not extend A\nmap written to {out}\n")
    page = out.read_text(encoding="utf-8")
    # Nothing to fetch: no URL of any scheme in src/href but inline data:, no @import or url().
    assert re.findall(r'(?:src|href)="([^"]*)"', page) == ["data:,"]
    assert "http://" not in page and "https://" not in page and "@import" not in page and "url(" not in page
    assert page.count('data-request="') == 2
    assert re.findall(r'data-cause="([^"]+)"', page) == ["first_request", "system_volatile_text"]
    # Prompt text only as short excerpts: the long system block is not in the file.
    assert SYSTEM[:200] not in page
    # The client's `</script>` cannot close the data script early.
    assert page.count("</script>") == 2
    # Opened from disk, no header applies: the file carries the served pages' policy itself.
    assert re.findall(r'<meta http-equiv="Content-Security-Policy" content="([^"]+)">', page) == [
        "default-src 'none'; style-src 'unsafe-inline'; script-src 'unsafe-inline'; img-src data:; "
        "base-uri 'none'; form-action 'none'"
    ]


def test_html_unwritable_path_is_exit_2(tmp_path: Path) -> None:
    pa, pb, _ = _pair(tmp_path)
    err = io.StringIO()
    assert explain_command(str(pa), str(pb), out=io.StringIO(), err=err, html_path=str(tmp_path / "no" / "x.html")) == 2
    assert "cannot write" in err.getvalue()


async def test_html_file_offline_in_the_browser(tmp_path: Path, browser: Browser) -> None:
    pa, pb, b = _pair(tmp_path)
    out = tmp_path / "map.html"
    explain_command(str(pa), str(pb), out=io.StringIO(), html_path=str(out))
    page = await browser.new_page()
    page.log.clear()
    await page.goto(out.as_uri())
    assert [p["request"]["url"] for name, p in page.log if name == "Network.requestWillBeSent"] == [out.as_uri()]
    # the file's own policy applies offline: a fetch from the page is refused, naming the directive
    refused = await page.js(
        "new Promise(done => { document.addEventListener('securitypolicyviolation', e => done(e.effectiveDirective));"
        " fetch('data:,x').then(() => done('allowed'), () => {}); })"
    )
    assert refused == "connect-src"
    causes = await page.js("[...document.querySelectorAll('tr[data-request] [data-cause]')].map(x => x.dataset.cause)")
    assert causes == ["first_request", "system_volatile_text"]
    tokens = await page.js("JSON.parse(document.getElementById('pc-data').textContent).tokens")
    prices = default_pricing().prices("anthropic", MODEL)
    assert prices is not None
    await page.js("document.getElementById('pc-divider').focus()")
    await page.key("End", "End", 35)
    value = await page.js("Number(document.getElementById('pc-cost').dataset.value)")
    ttl = next(m["cache_control"].get("ttl", "5m") for m in reversed(b["system"]) if "cache_control" in m)
    assert value == what_if(tokens, 1, len(tokens) - 1, prices, ttl).cost_usd

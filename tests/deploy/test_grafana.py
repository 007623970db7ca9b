"""grafana/: the dashboard parses (Grafana's own schema types, PromQL), queries only metrics a
running proxy exposes, and covers the panels the issue asks for; provisioning points at it."""

from __future__ import annotations

from pathlib import Path

import aiohttp
import orjson
import pytest
import yaml

from tests.deploy.promql import dashboard_exprs, exposed_names, metric_names, parse

ROOT = Path(__file__).resolve().parents[2]
DASHBOARD = ROOT / "grafana" / "dashboards" / "promptcache.json"
PROVISIONING = ROOT / "grafana" / "provisioning"


def _dashboard() -> dict:
    return orjson.loads(DASHBOARD.read_bytes())


def test_every_expression_parses() -> None:
    exprs = list(dashboard_exprs(_dashboard()))
    assert len(exprs) >= 25
    for where, expr in exprs:
        try:
            parse(expr)
        except Exception as exc:  # noqa: BLE001 - report which query is broken
            pytest.fail(f"{where}: {expr!r} does not parse: {exc}")


async def test_every_metric_is_exposed_by_a_running_proxy(make_proxy) -> None:
    proxy = await make_proxy(upstream="http://127.0.0.1:9", mode="observe")
    async with aiohttp.ClientSession() as client, client.get(proxy.url + "/metrics") as response:
        exposed = exposed_names(await response.text())
    used = set()
    for where, expr in dashboard_exprs(_dashboard()):
        names = metric_names(expr)
        assert names, f"{where} selects no metric"
        missing = names - exposed
        assert not missing, f"{where} uses {sorted(missing)}, not exposed by promptcache"
        used |= names
    for required in (
        "promptcache_input_tokens_total",
        "promptcache_cost_usd_total",
        "promptcache_uncached_cost_usd_total",
        "promptcache_prefix_divergence_position_ratio_bucket",
        "promptcache_prefix_divergences_total",
        "promptcache_proxy_overhead_seconds_bucket",
        "promptcache_stage_errors_total",
        "promptcache_session_store_errors_total",
        "promptcache_session_store_operation_duration_seconds_bucket",
    ):
        assert required in used, required


def test_required_panels_exist() -> None:
    dashboard = _dashboard()
    titles = {p["title"]: p for p in dashboard["panels"]}
    assert titles["Divergence position (share of prompt)"]["type"] == "heatmap"
    assert titles["Divergence position (share of prompt)"]["targets"][0]["format"] == "heatmap"
    hit = titles["Cache hit ratio"]["targets"][0]["expr"]
    assert 'cache="read"' in hit and hit.count("promptcache_input_tokens_total") == 2
    assert "promptcache_uncached_cost_usd_total" in titles["Savings (USD)"]["targets"][0]["expr"]
    assert "by (cause)" in titles["Causes over time"]["targets"][0]["expr"]
    overhead = [t["expr"] for t in titles["Proxy overhead p50 / p99"]["targets"]]
    assert overhead[0].startswith("histogram_quantile(0.5,") and overhead[1].startswith(
        "histogram_quantile(0.99,"
    )
    assert "stage_errors" in titles["Fail-open rate"]["targets"][0]["expr"]
    assert {"Store latency p99", "Store error ratio"} <= set(titles)
    assert "by (team)" in titles["Cost by team (USD per hour)"]["targets"][0]["expr"]
    agreement = titles["Upstream diagnostics vs promptcache"]["targets"][0]["expr"]
    assert "promptcache_diagnostics_agreement_total" in agreement
    assert titles["Upstream in use"]["targets"][0]["expr"] == "promptcache_upstream_info"


def test_layout_and_datasource() -> None:
    dashboard = _dashboard()
    ids = [p["id"] for p in dashboard["panels"]]
    assert len(ids) == len(set(ids))
    cells: set[tuple[int, int]] = set()
    for panel in dashboard["panels"]:
        pos = panel["gridPos"]
        assert pos["x"] + pos["w"] <= 24, panel["title"]
        area = {
            (x, y) for x in range(pos["x"], pos["x"] + pos["w"]) for y in range(pos["y"], pos["y"] + pos["h"])
        }
        assert not cells & area, f"{panel['title']} overlaps another panel"
        cells |= area
        if panel["type"] != "row":
            assert panel["datasource"] == {"type": "prometheus", "uid": "${datasource}"}


def test_grafana_schema_types_accept_the_dashboard() -> None:
    from grafana_foundation_sdk.cog.plugins import register_default_plugins
    from grafana_foundation_sdk.models import prometheus
    from grafana_foundation_sdk.models.dashboard import Dashboard, Panel, RowPanel

    register_default_plugins()
    raw = _dashboard()
    model = Dashboard.from_json(raw)
    assert (model.uid, model.title, len(model.panels or [])) == (
        "promptcache-overview",
        "promptcache",
        len(raw["panels"]),
    )
    for panel in model.panels or []:
        if isinstance(panel, RowPanel):
            continue
        assert isinstance(panel, Panel)
        assert panel.targets and all(isinstance(t, prometheus.Dataquery) for t in panel.targets), panel.title
    again = orjson.loads(orjson.dumps(model.to_json(), default=lambda value: value.to_json()))
    assert [p["title"] for p in again["panels"]] == [p["title"] for p in raw["panels"]]


def test_provisioning_points_at_the_dashboard() -> None:
    datasources = yaml.safe_load((PROVISIONING / "datasources" / "prometheus.yaml").read_text())
    assert datasources["apiVersion"] == 1
    [source] = datasources["datasources"]
    assert (source["type"], source["uid"], source["access"]) == ("prometheus", "prometheus", "proxy")
    providers = yaml.safe_load((PROVISIONING / "dashboards" / "promptcache.yaml").read_text())
    [provider] = providers["providers"]
    assert provider["type"] == "file"
    compose = yaml.safe_load((ROOT / "deploy" / "compose.yaml").read_text())
    mounts = dict(v.rsplit(":", 1)[0].split(":", 1) for v in compose["services"]["grafana"]["volumes"])
    assert (ROOT / "deploy" / "../grafana/dashboards").resolve() == DASHBOARD.parent
    assert mounts["../grafana/dashboards"] == provider["options"]["path"]

"""Helpers for checking PromQL in the dashboard and the alert rules against promptcache's metrics."""

from __future__ import annotations

import re
from collections.abc import Iterator
from typing import Any, Final

import promql_parser

GRAFANA_MACROS: Final = re.compile(
    r"\$__(rate_interval|interval|range)\b|\$\{__(rate_interval|interval|range)\}"
)
"""Grafana range macros; replaced by a literal duration before parsing."""
SUFFIXES: Final = {"counter": ("_total", "_created"), "histogram": ("_bucket", "_sum", "_count", "_created")}


def parse(expr: str) -> Any:
    """Parse one PromQL expression, Grafana macros replaced by `5m`."""
    return promql_parser.parse(GRAFANA_MACROS.sub("5m", expr))


def metric_names(expr: str) -> set[str]:
    """Every metric name a PromQL expression selects."""
    names: set[str] = set()

    def visit(node: Any) -> None:
        if isinstance(node, promql_parser.VectorSelector) and node.name:
            names.add(node.name)

    promql_parser.walk(parse(expr), pre_visit=visit)
    return names


def exposed_names(exposition: str) -> set[str]:
    """Sample names a text exposition can carry: its samples, plus every series name its
    `# TYPE` lines declare (a labelled metric with no child yet has no sample)."""
    names: set[str] = set()
    for line in exposition.splitlines():
        if line.startswith("# TYPE "):
            _, _, name, kind = line.split(" ", 3)
            names.add(name)
            for suffix in SUFFIXES.get(kind, ()):
                base = name.removesuffix("_total") if kind == "counter" else name
                names.add(base + suffix)
        elif line and not line.startswith("#"):
            names.add(re.split(r"[{ ]", line, maxsplit=1)[0])
    return names


def dashboard_exprs(dashboard: dict[str, Any]) -> Iterator[tuple[str, str]]:
    """`(where, expr)` for every panel target and every query variable of a dashboard."""

    def panels(items: list[dict[str, Any]]) -> Iterator[dict[str, Any]]:
        for panel in items:
            yield panel
            yield from panels(panel.get("panels", []))

    for panel in panels(dashboard.get("panels", [])):
        for target in panel.get("targets", []):
            yield f"panel {panel.get('title')!r} target {target.get('refId')}", target["expr"]
    for variable in dashboard.get("templating", {}).get("list", []):
        if variable.get("type") != "query":
            continue
        query = variable["query"]["query"] if isinstance(variable["query"], dict) else variable["query"]
        match = re.fullmatch(r"label_values\((.+),\s*\w+\)", query)
        yield f"variable {variable['name']!r}", match.group(1) if match else query

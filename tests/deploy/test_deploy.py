"""deploy/: Prometheus config and alert rules pass `promtool`, alerts use only promptcache's
metrics, and the Dockerfile, compose file and Kubernetes manifests hold together."""

from __future__ import annotations

import re
import shutil
import subprocess
from pathlib import Path
from typing import Any

import pytest
import yaml
from prometheus_client import CollectorRegistry, generate_latest

from proxy.metrics import Metrics
from proxy.rules import check_rules
from proxy.settings import SettingsError, load_settings
from tests.deploy.promql import exposed_names, metric_names

ROOT = Path(__file__).resolve().parents[2]
DEPLOY = ROOT / "deploy"
PROMETHEUS = DEPLOY / "prometheus"
KUBERNETES = DEPLOY / "kubernetes"
PROMTOOL = shutil.which("promtool")
needs_promtool = pytest.mark.skipif(
    PROMTOOL is None, reason="promtool not installed (Debian package `prometheus`); CI installs it"
)


def _promtool(*args: str) -> subprocess.CompletedProcess[str]:
    assert PROMTOOL is not None
    return subprocess.run([PROMTOOL, *args], capture_output=True, text=True, timeout=120, cwd=ROOT)


@needs_promtool
@pytest.mark.parametrize("config", ["prometheus.yml", "prometheus-kubernetes.yml"])
def test_promtool_check_config(config: str, tmp_path: Path) -> None:
    # The scrape authenticates with the admin token from a file that exists only where
    # Prometheus runs (a compose or Kubernetes secret): check a copy pointing at a stand-in.
    loaded = yaml.safe_load((PROMETHEUS / config).read_text())
    [job] = loaded["scrape_configs"]
    assert job["authorization"]["type"] == "Bearer"
    assert job["authorization"]["credentials_file"].startswith("/")
    token = tmp_path / "admin_token"
    token.write_text("stand-in\n")
    job["authorization"]["credentials_file"] = str(token)
    shutil.copy(PROMETHEUS / "alerts.yml", tmp_path / "alerts.yml")
    (tmp_path / config).write_text(yaml.safe_dump(loaded))
    result = _promtool("check", "config", str(tmp_path / config))
    assert result.returncode == 0, result.stdout + result.stderr
    assert "SUCCESS: 1 rule files found" in result.stdout


@needs_promtool
def test_promtool_check_and_test_rules() -> None:
    check = _promtool("check", "rules", str(PROMETHEUS / "alerts.yml"))
    assert check.returncode == 0, check.stdout + check.stderr
    assert "SUCCESS: 6 rules found" in check.stdout
    unit = _promtool("test", "rules", str(PROMETHEUS / "alerts_test.yml"))
    assert unit.returncode == 0, unit.stdout + unit.stderr


def _alerts() -> list[dict[str, Any]]:
    doc = yaml.safe_load((PROMETHEUS / "alerts.yml").read_text())
    return [rule for group in doc["groups"] for rule in group["rules"]]


def test_alerts_cover_the_issue_and_use_declared_metrics() -> None:
    declared = exposed_names(generate_latest(Metrics(CollectorRegistry()).registry).decode())
    alerts = {rule["alert"]: rule for rule in _alerts()}
    assert {
        "PromptcacheHitRatioDrop",
        "PromptcacheUnexpectedMisses",
        "PromptcacheFailOpen",
        "PromptcacheUpstreamErrors",
    } <= set(alerts)
    for name, rule in alerts.items():
        used = metric_names(rule["expr"])
        assert used - declared <= {"up"}, f"{name} uses {sorted(used - declared - {'up'})}"
        assert rule["labels"]["severity"] in ("warning", "critical")
        assert rule["annotations"]["summary"]


def test_compose_runs_two_replicas_redis_prometheus_grafana() -> None:
    compose = yaml.safe_load((DEPLOY / "compose.yaml").read_text())
    services = compose["services"]
    assert set(services) == {"proxy-1", "proxy-2", "redis", "prometheus", "grafana"}
    for name in ("proxy-1", "proxy-2"):
        proxy = services[name]
        assert proxy["build"] == {"context": "..", "dockerfile": "deploy/Dockerfile"}
        assert proxy["environment"]["PROMPTCACHE_STORE"] == (
            "redis://:${REDIS_PASSWORD:?set REDIS_PASSWORD (letters and digits) for Redis auth}@redis:6379/0"
        )
        assert proxy["environment"]["PROMPTCACHE_ADMIN_PORT"] == "9464"
        # Never the simulator by accident: `auto` would serve canned answers after a DNS blip.
        assert proxy["environment"]["PROMPTCACHE_UPSTREAM"] == "${PROMPTCACHE_UPSTREAM:-real}"
        assert "PROMPTCACHE_SECRET" in proxy["environment"]
        assert proxy["environment"]["PROMPTCACHE_ADMIN_TOKEN"].startswith("${PROMPTCACHE_ADMIN_TOKEN:?")
        # The image keeps the admin listener on the container's loopback; Prometheus needs it outside.
        assert proxy["environment"]["PROMPTCACHE_ADMIN_HOST"] == "0.0.0.0"
    assert services["prometheus"]["secrets"] == ["promptcache_admin_token"]
    assert compose["secrets"] == {"promptcache_admin_token": {"environment": "PROMPTCACHE_ADMIN_TOKEN"}}
    for service in services.values():
        for volume in service.get("volumes", []):
            source = volume.split(":", 1)[0]
            assert (DEPLOY / source).exists(), volume
    scrape = yaml.safe_load((PROMETHEUS / "prometheus.yml").read_text())
    targets = scrape["scrape_configs"][0]["static_configs"][0]["targets"]
    assert targets == ["proxy-1:9464", "proxy-2:9464"]


_REQUIRED_VAR = re.compile(r"\$\{(\w+):\?[^}]*\}")
_DEFAULTED_VAR = re.compile(r"\$\{(\w+):-([^}]*)\}")


def _interpolate(value: str, environ: dict[str, str]) -> str:
    """Compose's `${VAR:?message}` (required) and `${VAR:-default}` over `environ`."""

    def required(match: re.Match[str]) -> str:
        if not environ.get(match.group(1)):
            raise KeyError(match.group(1))
        return environ[match.group(1)]

    value = _REQUIRED_VAR.sub(required, value)
    return _DEFAULTED_VAR.sub(lambda m: environ.get(m.group(1)) or m.group(2), value)


def test_compose_requires_every_password_and_redis_checks_it() -> None:
    services = yaml.safe_load((DEPLOY / "compose.yaml").read_text())["services"]
    environ = {"PROMPTCACHE_SECRET": "s" * 64, "REDIS_PASSWORD": "a1b2c3", "GRAFANA_ADMIN_PASSWORD": "g7"}
    grafana = services["grafana"]["environment"]["GF_SECURITY_ADMIN_PASSWORD"]
    assert _interpolate(grafana, environ) == "g7"
    with pytest.raises(KeyError, match="GRAFANA_ADMIN_PASSWORD"):
        _interpolate(grafana, {})
    proxy = services["proxy-1"]["environment"]
    assert _interpolate(proxy["PROMPTCACHE_STORE"], environ) == "redis://:a1b2c3@redis:6379/0"
    with pytest.raises(KeyError, match="REDIS_PASSWORD"):
        _interpolate(proxy["PROMPTCACHE_STORE"], {"PROMPTCACHE_SECRET": "s" * 64})
    redis = services["redis"]
    assert [_interpolate(arg, environ) for arg in redis["command"]] == [
        "redis-server", "--requirepass", "a1b2c3", "--save", "", "--appendonly", "no",
        "--maxmemory", "512mb", "--maxmemory-policy", "allkeys-lru",
    ]
    assert _interpolate(redis["environment"]["REDISCLI_AUTH"], environ) == "a1b2c3"
    assert redis["healthcheck"]["test"] == ["CMD", "redis-cli", "ping"]
    assert ":-admin" not in (DEPLOY / "compose.yaml").read_text()


def test_dockerfile_runs_unprivileged_with_a_healthcheck() -> None:
    text = (DEPLOY / "Dockerfile").read_text()
    lines = [line.strip() for line in text.splitlines()]
    user = [line for line in lines if line.startswith("USER ")]
    assert user == ["USER 10001"]
    assert any(line.startswith("HEALTHCHECK ") for line in lines)
    assert "http://127.0.0.1:8080/healthz" in text
    for line in lines:
        if line.startswith("COPY ") and "--from" not in line:
            for source in line.split()[1:-1]:
                assert (ROOT / source).exists(), source
    assert lines.index("USER 10001") > max(i for i, line in enumerate(lines) if line.startswith("RUN "))


def _stages(text: str) -> list[list[str]]:
    """The Dockerfile's instructions per stage (continuation lines joined)."""
    joined = text.replace("\\\n", " ")
    stages: list[list[str]] = []
    for line in joined.splitlines():
        line = " ".join(line.split())
        if line.startswith("FROM "):
            stages.append([])
        if line and not line.startswith("#"):
            stages[-1].append(line)
    return stages


def test_dockerfile_installs_a_built_wheel_not_the_source_tree() -> None:
    build, final = _stages((DEPLOY / "Dockerfile").read_text())
    assert build[0] == "FROM python:3.11-slim AS build"
    assert [i for i in build if i.startswith("COPY ")] == [
        "COPY pyproject.toml README.md ./",
        "COPY proxy ./proxy",
        "COPY rules ./rules",
        "COPY workloads ./workloads",
    ]
    assert [i for i in build if i.startswith("RUN ")] == ["RUN pip wheel --wheel-dir /wheels ."]
    assert final[0] == "FROM python:3.11-slim"
    assert [i for i in final if i.startswith(("COPY ", "ADD "))] == ["COPY --from=build /wheels /wheels"]
    [run] = [i for i in final if i.startswith("RUN ")]
    assert run.startswith("RUN pip install --no-index --find-links /wheels promptcache && rm -rf /wheels && ")
    assert "--editable" not in (DEPLOY / "Dockerfile").read_text()
    ignore = (DEPLOY / "Dockerfile.dockerignore").read_text().splitlines()
    assert {"!pyproject.toml", "!README.md", "!proxy/**", "!rules/**", "!workloads/**"} <= set(ignore)


def _manifests() -> list[dict[str, Any]]:
    kustomization = yaml.safe_load((KUBERNETES / "kustomization.yaml").read_text())
    docs = []
    for name in kustomization["resources"]:
        docs += [doc for doc in yaml.safe_load_all((KUBERNETES / name).read_text()) if doc]
    return docs


def test_kubernetes_manifests() -> None:
    docs = {(d["kind"], d["metadata"]["name"]): d for d in _manifests()}
    deployment = docs["Deployment", "promptcache"]
    spec = deployment["spec"]
    assert spec["replicas"] == 2
    pod = spec["template"]["spec"]
    assert pod["securityContext"]["runAsNonRoot"] is True and pod["securityContext"]["runAsUser"] == 10001
    [container] = pod["containers"]
    env = {e["name"]: e.get("value", e.get("valueFrom")) for e in container["env"]}
    assert env["PROMPTCACHE_STORE"] == "redis://:$(REDIS_PASSWORD)@redis:6379/0"
    names = [e["name"] for e in container["env"]]
    assert names.index("REDIS_PASSWORD") < names.index("PROMPTCACHE_STORE")  # $(VAR) needs it defined first
    assert env["REDIS_PASSWORD"] == {"secretKeyRef": {"name": "promptcache", "key": "redis-password"}}
    assert env["PROMPTCACHE_UPSTREAM"] == "real"
    assert env["PROMPTCACHE_SECRET"] == {"secretKeyRef": {"name": "promptcache", "key": "secret"}}
    assert env["PROMPTCACHE_ADMIN_TOKEN"] == {"secretKeyRef": {"name": "promptcache", "key": "admin-token"}}
    assert env["PROMPTCACHE_ADMIN_HOST"] == "0.0.0.0"
    # These settings start (a non-loopback admin listener needs its token).
    plain = {k: v for k, v in env.items() if isinstance(v, str)}
    load_settings(environ={**plain, "PROMPTCACHE_SECRET": "s" * 32, "PROMPTCACHE_ADMIN_TOKEN": "t"})
    with pytest.raises(SettingsError, match="admin_token: required"):
        load_settings(environ={**plain, "PROMPTCACHE_SECRET": "s" * 32})
    assert container["livenessProbe"]["httpGet"]["path"] == "/healthz"
    assert container["readinessProbe"]["httpGet"]["path"] == "/readyz"
    ports = {p["name"]: p["containerPort"] for p in container["ports"]}
    assert ports == {"http": 8080, "metrics": 9464}
    labels = spec["template"]["metadata"]["labels"]
    for name in ("promptcache", "promptcache-metrics"):
        service = docs["Service", name]
        assert service["spec"]["selector"].items() <= labels.items()
    assert docs["Service", "promptcache-metrics"]["spec"]["clusterIP"] == "None"
    assert docs["Service", "redis"]["spec"]["ports"][0]["port"] == 6379
    assert docs["Deployment", "redis"]["spec"]["template"]["metadata"]["labels"].items() >= (
        docs["Service", "redis"]["spec"]["selector"].items()
    )
    [redis] = docs["Deployment", "redis"]["spec"]["template"]["spec"]["containers"]
    assert redis["args"][:3] == ["redis-server", "--requirepass", "$(REDIS_PASSWORD)"]
    assert {e["name"]: e["valueFrom"] for e in redis["env"]} == {
        name: {"secretKeyRef": {"name": "promptcache", "key": "redis-password"}}
        for name in ("REDIS_PASSWORD", "REDISCLI_AUTH")
    }
    policy = docs["NetworkPolicy", "redis"]["spec"]
    assert policy == {
        "podSelector": {"matchLabels": {"app.kubernetes.io/name": "redis"}},
        "policyTypes": ["Ingress"],
        "ingress": [
            {
                "from": [{"podSelector": {"matchLabels": {"app.kubernetes.io/name": "promptcache"}}}],
                "ports": [{"protocol": "TCP", "port": 6379}],
            }
        ],
    }
    assert "app.kubernetes.io/name" in labels and labels["app.kubernetes.io/name"] == "promptcache"
    rules = docs["ConfigMap", "promptcache-rules"]
    [mount] = [m for m in container["volumeMounts"] if m["name"] == "rules"]
    assert mount["subPath"] in rules["data"]
    # The image installs a wheel: its packaged rules are the data files under /usr/local/share.
    assert mount["mountPath"] == "/usr/local/share/promptcache/rules/" + mount["subPath"]
    [volume] = [v for v in pod["volumes"] if v["name"] == "rules"]
    assert volume["configMap"]["name"] == "promptcache-rules"


def test_configmap_rules_load_with_the_packaged_ones(tmp_path: Path) -> None:
    docs = {(d["kind"], d["metadata"]["name"]): d for d in _manifests()}
    folder = tmp_path / "rules"
    shutil.copytree(ROOT / "rules", folder)
    for name, text in docs["ConfigMap", "promptcache-rules"]["data"].items():
        (folder / name).write_text(text)
    assert check_rules(folder) == []


def test_kubernetes_manifests_pass_the_schemas() -> None:
    kubernetes_validate = pytest.importorskip("kubernetes_validate")
    docs = _manifests()
    assert len(docs) == 8
    for doc in docs:
        kubernetes_validate.validate(doc, "1.34.0", strict=True)

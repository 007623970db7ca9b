"""`RESPONSE_STAGES`: the response side in one written order, each stage failing open on its own."""

from __future__ import annotations

from typing import Final

import orjson
from multidict import CIMultiDict, CIMultiDictProxy
from prometheus_client import CollectorRegistry

from proxy.exchange import Exchange
from proxy.metrics import Metrics
from proxy.providers import ANTHROPIC
from proxy.providers.base import Usage
from proxy.response import RESPONSE_STAGES, ResponseStage, run_response_stages
from proxy.rules import RuleSet
from proxy.services import Services
from proxy.settings import Settings
from tests.measure.bodies import BASE

NO_MINIMUM = RuleSet(rules=(), min_tokens_by_prefix=(), default_min_tokens=0)


def _exchange() -> Exchange:
    ex = Exchange(ANTHROPIC, "/v1/messages", "", CIMultiDictProxy(CIMultiDict()), orjson.dumps(BASE))
    ex.body = BASE
    ex.status = 200
    ex.usage = Usage(input_none=20, cache_write_5m=300, output=10, seen=True)
    return ex


def _services() -> Services:
    return Services(settings=Settings(), metrics=Metrics(CollectorRegistry()), rules=NO_MINIMUM)


def _errors(services: Services, stage: str) -> float:
    value = services.metrics.registry.get_sample_value("promptcache_stage_errors_total", {"stage": stage})
    return 0.0 if value is None else value


class _Broken:
    name: Final = "broken"
    error_label: Final = "observe"

    def run(self, exchange: Exchange, services: Services) -> None:
        raise RuntimeError("boom")


def test_the_order_is_written_once() -> None:
    assert [s.name for s in RESPONSE_STAGES] == ["usage", "measure", "record", "debug"]
    assert [s.error_label for s in RESPONSE_STAGES] == ["observe", "observe", "session", "observe"]


def test_usage_and_measurement_of_a_finished_exchange() -> None:
    services, ex = _services(), _exchange()
    run_response_stages(ex, services)
    assert ex.is_usage_counted is True
    assert ex.measurement is not None and ex.measurement.cause == "first_request"
    written = services.metrics.registry.get_sample_value(
        "promptcache_input_tokens_total", {"provider": "anthropic", "cache": "write"}
    )
    assert written == 300


def test_a_failing_stage_is_counted_and_the_later_ones_still_run() -> None:
    services, ex = _services(), _exchange()
    usage, measure, record, debug = RESPONSE_STAGES
    stages: tuple[ResponseStage, ...] = (usage, _Broken(), measure, record, debug)
    run_response_stages(ex, services, stages)
    assert _errors(services, "observe") == 1
    assert ex.is_usage_counted is True and ex.measurement is not None

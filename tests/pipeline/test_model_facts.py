"""`ModelFacts`: the model, capabilities and minimum tokens a request's stages ask about are
worked out once per request, and again when the model or the rules change."""

from __future__ import annotations

from multidict import CIMultiDict, CIMultiDictProxy
from prometheus_client import CollectorRegistry

from proxy.exchange import Exchange
from proxy.metrics import Metrics
from proxy.pipeline.support import (
    capabilities_for,
    min_tokens_for,
    model_for,
    request_capabilities,
    request_min_tokens,
)
from proxy.providers import ANTHROPIC
from proxy.rules import load_rules
from proxy.services import Services
from proxy.settings import Settings


def _exchange(model: object) -> Exchange:
    exchange = Exchange(ANTHROPIC, "/v1/messages", "", CIMultiDictProxy(CIMultiDict()), b"{}")
    exchange.body = {"model": model, "max_tokens": 8, "messages": []}
    return exchange


def test_the_facts_are_the_plain_answers_and_follow_a_new_model() -> None:
    services = Services(Settings(), Metrics(CollectorRegistry()), rules=load_rules())
    exchange = _exchange("claude-opus-4-1")
    assert model_for(exchange) == "claude-opus-4-1"
    first = (request_min_tokens(services, exchange), request_capabilities(services, exchange))
    assert first == (
        min_tokens_for(services, exchange, "claude-opus-4-1"),
        capabilities_for(services, ANTHROPIC, "claude-opus-4-1"),
    )
    assert first[0] == 1024
    facts = exchange.model_facts
    request_min_tokens(services, exchange)
    assert exchange.model_facts is facts  # asked again: not worked out again
    exchange.body = {**exchange.body, "model": "claude-haiku-4-5"}  # a body with another model
    assert model_for(exchange) == "claude-haiku-4-5"
    assert exchange.model_facts is not facts
    assert request_min_tokens(services, exchange) == min_tokens_for(services, exchange, "claude-haiku-4-5") == 4096


def test_a_non_string_model_is_no_model_and_new_rules_are_read_again() -> None:
    services = Services(Settings(), Metrics(CollectorRegistry()), rules=load_rules())
    exchange = _exchange(1)
    assert model_for(exchange) is None
    default = request_min_tokens(services, exchange)
    assert default == load_rules().default_min_tokens
    exchange.body = {**exchange.body, "model": True}  # equal to 1, but another value
    assert model_for(exchange) is None and exchange.model_facts is not None
    assert exchange.model_facts.raw is True
    services.rules = load_rules()  # a reload: a new RuleSet object
    facts = exchange.model_facts
    assert request_min_tokens(services, exchange) == default
    assert facts.rules is services.rules

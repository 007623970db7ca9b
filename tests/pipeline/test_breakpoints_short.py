"""A body too short to cache and without client markers: `place_breakpoints` answers without
the planner, and its answer is the planner's (`breakpoints._plan`) on the same body."""

from __future__ import annotations

import copy
from typing import Any

from hypothesis import HealthCheck, given, settings

from proxy.pipeline.blocks import Editor
from proxy.pipeline.breakpoints import Plan, _finish, _plan, place_breakpoints
from proxy.pipeline.layout import LayoutCache
from proxy.pipeline.planner import first_cacheable, prefix_cache_key, system_ends
from proxy.pipeline.support import NO_CAPABILITY_LIMITS
from proxy.providers import ANTHROPIC, route
from tests.pipeline.strategies import anthropic_bodies, contexts, openai_bodies

FAST = settings(max_examples=80, deadline=None, suppress_health_check=[HealthCheck.too_slow])


def _planner_answer(adapter: Any, body: dict[str, Any], min_tokens: int, context: Any) -> tuple[Any, Plan]:
    """What the planner itself gives (the path before the short-body answer existed)."""
    policy = adapter.marker_policy(body)
    view, marks, nested = LayoutCache().view(adapter, body, policy, adapter.tool_shape.call_kinds)
    editor = Editor(body)
    cache_key = None
    if policy.cache_key_field is not None and policy.cache_key_field not in body:
        cache_key = prefix_cache_key(view, policy, system_ends(view, None)[0])
        if cache_key is not None:
            editor.set((policy.cache_key_field,), cache_key)
    if policy.max_markers <= 0:
        return _finish(editor, adapter, cache_key), Plan(cache_key=cache_key)
    top = body.get(policy.top_level_key) if policy.top_level_key is not None else None
    cacheable_from = first_cacheable(view, policy, min_tokens)
    ends = system_ends(view, None)
    caps = NO_CAPABILITY_LIMITS
    return _plan(editor, adapter, view, policy, caps, context, marks, nested, top, cacheable_from, ends, cache_key)


def _check(adapter: Any, body: dict[str, Any], context: Any) -> None:
    sent = copy.deepcopy(body)
    for min_tokens in (0, 8, 10**9):  # 10**9: no prefix reaches it, the short-body answer applies
        got = place_breakpoints(adapter, body, min_tokens=min_tokens, context=context)
        assert got == _planner_answer(adapter, body, min_tokens, context)
        assert body == sent


@FAST
@given(anthropic_bodies(), contexts)
def test_short_anthropic_bodies_get_the_planners_answer(body: dict[str, Any], context: Any) -> None:
    _check(ANTHROPIC, body, context)


@FAST
@given(openai_bodies(), contexts)
def test_short_openai_bodies_get_the_planners_answer(case: tuple[str, dict[str, Any]], context: Any) -> None:
    path, body = case
    _check(route(path, False)[0], body, context)


def test_an_unmarked_short_body_goes_out_as_it_came() -> None:
    body = {"model": "claude-sonnet-4-6", "max_tokens": 8, "messages": [{"role": "user", "content": "hi"}]}
    out, plan = place_breakpoints(ANTHROPIC, body, min_tokens=1024)
    assert out is body
    assert plan == Plan()

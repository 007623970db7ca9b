"""A request without a system prompt: `plan_system` answers the empty plan at once."""

from __future__ import annotations

from proxy.pipeline.reorder import NO_SYSTEM, SystemPlan, plan_system
from proxy.pipeline.segments import classifier_for
from proxy.rules import load_rules


def test_no_units_give_the_unchanged_empty_plan() -> None:
    plan = plan_system((), classifier_for(load_rules()))
    assert plan is NO_SYSTEM
    assert plan == SystemPlan(parts=(), tiers=(), moved=(), changed=False, markers_moved=0, markers_dropped=0)
    assert (plan.slots, plan.emptied, plan.repeated, plan.dropped_messages, plan.is_budget_spent) == (
        (),
        False,
        0,
        0,
        False,
    )

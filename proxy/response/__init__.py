"""The response side: stages run once per pipeline request after the last byte went to the client.

Order (data, not control flow): `RESPONSE_STAGES`, written once here, as `REQUEST_STAGES` is for
the request side (`proxy.pipeline`):
1. `usage`: the upstream's reported usage into the token counters (`proxy.pipeline.observe.record_usage`,
   once per exchange: the handler also counts it when the client left mid-stream);
2. `measure`: prefix divergence, predicted and actual reads, cost (`proxy.measure.measure`),
   leaving `Exchange.measurement`;
3. `record`: the session's new `SessionRecord`, handed to the store's background writer
   (`proxy.pipeline.session.after_response`; 2xx only);
4. `debug`: the measurement into the session history behind `/debug/sessions` and `/ui/`
   (`proxy.debug.remember_measurement`).

Contract: a stage is synchronous on purpose. Once the last byte is written nothing here awaits,
so a client that closes its connection at once (curl, urllib, HTTP/1.0) cannot cancel it; the
record write outlives the handler (`proxy.store.RecordStore.save_soon`) and is drained on shutdown.
Each stage fails open on its own: an exception is counted in
`promptcache_stage_errors_total{stage=<the stage's error_label>}` and the next stage still runs;
nothing reaches the client. A request over the pipeline budget runs only the stages with
`runs_over_budget` (usage, and the cost alone). The whole side is timed as
`promptcache_stage_duration_seconds{stage="observe"}` (the record build included, the
background write not).
"""

from __future__ import annotations

import logging
import time
from collections.abc import Callable
from dataclasses import dataclass
from typing import Final, Protocol

from proxy.debug import remember_measurement
from proxy.exchange import Exchange
from proxy.malformed import is_too_deep
from proxy.measure import measure
from proxy.pipeline.observe import record_usage
from proxy.pipeline.session import after_response
from proxy.services import Services

_log = logging.getLogger("promptcache.observe")


class ResponseStage(Protocol):
    @property
    def name(self) -> str:
        """The stage's name in `RESPONSE_STAGES` (documentation, logs)."""
        ...

    @property
    def error_label(self) -> str:
        """`stage` label of `promptcache_stage_errors_total` for its failures (`proxy.metrics.STAGES`)."""
        ...

    @property
    def runs_over_budget(self) -> bool:
        """Whether it runs for a request over the pipeline budget (`proxy.pipeline.budget`)."""
        ...

    def run(self, exchange: Exchange, services: Services) -> None: ...


@dataclass(frozen=True)
class _Stage:
    """One response stage: `run` calls `step` (the stage's behaviour lives in its module)."""

    name: str
    error_label: str
    runs_over_budget: bool
    step: Callable[[Exchange, Services], None]

    def run(self, exchange: Exchange, services: Services) -> None:
        self.step(exchange, services)


RESPONSE_STAGES: Final[tuple[ResponseStage, ...]] = (
    _Stage("usage", "observe", True, record_usage),
    _Stage("measure", "observe", True, measure),  # over the budget: the cost only
    _Stage("record", "session", False, after_response),
    _Stage("debug", "observe", False, remember_measurement),
)


def run_response_stages(
    exchange: Exchange, services: Services, stages: tuple[ResponseStage, ...] = RESPONSE_STAGES
) -> None:
    """Run `stages` in order on a finished exchange (module docstring); never raises."""
    started = time.perf_counter()
    for stage in stages:
        if exchange.over_budget is not None and not stage.runs_over_budget:
            continue  # nothing but usage for a request over the pipeline budget
        try:
            stage.run(exchange, services)
        except Exception as exc:  # noqa: BLE001 - fail open is the contract
            if is_too_deep(exc):  # nothing measured of a body nested deeper than orjson writes
                services.metrics.malformed_parts.labels("observe", "too_deep").inc()
            else:
                services.metrics.stage_error_counters[stage.error_label].inc()
                _log.warning("response stage %s failed (%s)", stage.name, type(exc).__name__)
    services.metrics.stage_timers["observe"].observe(time.perf_counter() - started)

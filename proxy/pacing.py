"""Pacing: predict the next gap from the response, and the TTLs that pay for it. Pure.

A provider cache entry lives from the start of the request that wrote or last read it
(docs/provider-rules.md 1.7), so what decides a read is the gap before the request that needs it. That
gap depends on who acts next, which the previous response says (`Usage.turn`, read by the
provider adapters): a response that ends the turn (`human`) hands control to a person, whose
gap is minutes; a tool call (`tool`) comes back in seconds. So pacing keeps two gap
distributions, human gaps and tool gaps, and how often a response ends the turn.

`Pacing` holds them for one session (in its `SessionRecord`) or one tenant (its own store entry,
`proxy.session_identity.TenantPacing`): at most `MAX_GAPS` recent gaps of each kind (seconds) and
counts of responses, turn-ending responses and of the human gaps that followed them (all
halved when responses pass `MAX_RESPONSES`): `return_share`, the chance that a person comes
back at all, is the last over the second (prior `RETURN_PRIOR`).

Forecast (`forecast(session, tenant)`), with a documented prior for a new tenant:
- shares of gaps under 5 minutes and between 5 minutes and an hour, over the session's and
  the tenant's samples of that kind; with no sample of a kind yet, the prior: human gaps
  lognormal with median 4 minutes and sigma 1.65 (`HUMAN_PRIOR`: 55% under 5 minutes, 40%
  within the hour, 5% beyond), tool gaps `TOOL_PRIOR` (98% under 5 minutes, 2% within the
  hour). Observed gaps replace the prior at once: a tenant whose gaps are all 30 s never pays
  for 1-hour writes because people in general pause longer;
- `p_end`, the chance that this request's response ends the turn: turn-ending responses over
  responses (session and tenant), `END_PRIOR` (0.3) before any response was seen;
- `next_hour` = `p_end * human[5m..1h] + (1 - p_end) * tool[5m..1h]`: the chance that the next
  request comes after a 5-minute entry expired but while a 1-hour one still lives.

TTL rule (`choose_ttls`), costs per prefix token in multiples of the base input price
(docs/provider-rules.md 1.9 and 9: 5m write 1.25, 1h write 2.0, read 0.1), three markers:
- the **anchor**, the previous request's last marker (the entry this request reads): while
  that entry lives (`expired` false) a 1h marker on it costs nothing more than the read, and
  a read refreshes the entry for the marker's TTL (the simulator's rule, docs/provider-rules.md 1.7:
  "refreshed on read"), so the anchor is `1h` whenever it is alive. After a human pause the
  next request still reads everything up to it;
- the **tail** (the newest block) writes the request's new tokens `d` (per prefix token: with
  a live anchor the new part, else the whole prompt). A 5m tail is lost when the next gap falls
  in 5m..1h, and the next request writes that part again instead of reading it:
      cost(5m) = 1.25 d + next_hour * (1.25 - 0.1) d,    cost(1h) = 2.0 d
  so the tail gets `1h` when `next_hour` > 0.75 / 1.15 = 0.652: people who come back after
  5-60 minutes most of the time (a tenant paced like that, or its human turns). Otherwise the
  rolling tool-loop tail stays 5m, and a pause costs only the newest part again. A subagent
  request (machine-paced: Claude Code's `x-claude-code-agent-id`, `agent=True`) gets a 5m
  tail, and its gaps are not the parent's;
- the **shared prefix** (tools and stable system, read by the tenant's other conversations):
  `1h` when the tail is (a 1h entry must not follow a 5m one), or when its entry is alive now
  (`shared_live`: sent less than 5 minutes ago) and `next_hour` is above `SHARED_MIN_CHANCE`
  (a refresh at the read price); else `5m`.
Cost guard (`tail_pays`): a tail nobody is predicted to read is not written. Against sending
the new tokens uncached (1.0), a 5m tail costs 0.25 more now and saves 1.15 when the next
request comes within 5 minutes (`next_soon`), a 1h tail 1.0 more and saves 1.15 when it comes
within the hour; when neither pays (`next_soon` <= 0.217 and `next_soon + next_hour` <= 0.870:
the conversation is predicted to end, or to resume only after the hour) no marker writes past
the anchor, and the shared prefix and the anchor keep theirs.
A client's own TTL is never shortened (`proxy.pipeline.planner.Planner.finish`); every marker
before a 1h one becomes 1h (1.7).
"""

from __future__ import annotations

from collections.abc import Mapping, Sequence
from dataclasses import dataclass
from typing import Any, Final, Literal

from proxy.frozen import fast_init

Ttl = Literal["5m", "1h"]

FIVE_MINUTES: Final = 300.0
ONE_HOUR: Final = 3600.0
WRITE_5M: Final = 1.25
WRITE_1H: Final = 2.0
READ: Final = 0.1
MAX_GAPS: Final = 32
"""Recent gaps kept per kind (human, tool) for a session or a tenant."""
MAX_RESPONSES: Final = 1024
"""Response counts are halved past this, so the turn-end share follows recent behaviour."""
MAX_ARRIVALS: Final = 16
"""Arrival times worth keeping per session or shared prefix."""
HUMAN_PRIOR: Final = (0.55, 0.40)
"""Prior human gaps: shares under 5 minutes and within 5 minutes..1 hour (lognormal, median
4 minutes, sigma 1.65)."""
TOOL_PRIOR: Final = (0.98, 0.02)
"""Prior tool gaps: shares under 5 minutes and within 5 minutes..1 hour."""
END_PRIOR: Final = 0.3
"""Prior chance that a response ends the turn."""
RETURN_PRIOR: Final = 0.8
"""Prior chance that a person comes back after a turn ends (about one conversation in five
ends after one or two requests, some are abandoned: the realistic workloads' shape)."""
RETURN_WEIGHT: Final = 2.0
"""Turn-ending responses the prior weighs as."""
SHARED_MIN_CHANCE: Final = 0.01
"""`next_hour` above which a live shared prefix is refreshed with a 1h marker."""

HUMAN: Final = "human"
TOOL: Final = "tool"


@fast_init
@dataclass(frozen=True, slots=True)
class Pacing:
    """Recent gaps by kind and turn-end counts of one session or tenant (bounded)."""

    human: tuple[float, ...] = ()
    """Seconds between a turn-ending response's request and the next request, newest last."""
    tool: tuple[float, ...] = ()
    """Seconds between a tool-call response's request and the next request, newest last."""
    ends: int = 0
    """Responses that ended the turn."""
    responses: int = 0
    """Responses whose kind was known."""
    returns: int = 0
    """Human gaps seen (a person came back after a turn-ending response), at most `ends`."""

    def with_gap(self, kind: str | None, gap: float) -> Pacing:
        """Add the gap (seconds) that followed a response of `kind` (`human` / `tool`)."""
        gap = max(0.0, float(gap))
        if kind == HUMAN:
            returns = min(self.returns + 1, self.ends) if self.ends else self.returns + 1
            return Pacing((*self.human, gap)[-MAX_GAPS:], self.tool, self.ends, self.responses, returns)
        if kind == TOOL:
            return Pacing(self.human, (*self.tool, gap)[-MAX_GAPS:], self.ends, self.responses, self.returns)
        return self

    def with_response(self, turn: str | None) -> Pacing:
        """Count a response (`human` ended the turn, `tool` did not; `None` is not counted)."""
        if turn not in (HUMAN, TOOL):
            return self
        ends, responses, returns = self.ends + (turn == HUMAN), self.responses + 1, self.returns
        if responses > MAX_RESPONSES:
            ends, responses, returns = ends // 2, responses // 2, returns // 2
        return Pacing(self.human, self.tool, ends, responses, min(returns, ends))

    @property
    def return_share(self) -> float:
        """Chance that a person comes back at all after a turn-ending response: human gaps seen
        over turn-ending responses, with `RETURN_PRIOR` weighing as `RETURN_WEIGHT` responses
        (a conversation's last answer, and one abandoned, is never followed)."""
        return (self.returns + RETURN_PRIOR * RETURN_WEIGHT) / (self.ends + RETURN_WEIGHT)

    def to_json(self) -> dict[str, Any]:
        return {"h": list(self.human), "t": list(self.tool), "e": self.ends, "n": self.responses, "r": self.returns}

    @classmethod
    def from_json(cls, value: Any) -> Pacing:
        """The inverse of `to_json`; anything unreadable is an empty `Pacing`."""
        if not isinstance(value, Mapping):
            return cls()
        try:
            human = tuple(float(g) for g in value.get("h", ()))[-MAX_GAPS:]
            tool = tuple(float(g) for g in value.get("t", ()))[-MAX_GAPS:]
            ends, responses = int(value.get("e", 0)), int(value.get("n", 0))
            returns = int(value.get("r", 0))
        except (TypeError, ValueError):
            return cls()
        if not 0 <= ends <= responses:
            return cls(human, tool)
        return cls(human, tool, ends, responses, min(max(returns, 0), ends))


@fast_init
@dataclass(frozen=True, slots=True)
class Forecast:
    """What the next gap will be, as shares (0..1)."""

    p_end: float
    """Chance that this request's response ends the turn."""
    human_soon: float
    """Human gaps under 5 minutes."""
    human_hour: float
    """Human gaps within 5 minutes..1 hour."""
    tool_soon: float
    tool_hour: float

    @property
    def next_hour(self) -> float:
        """Chance that the next request comes within 5 minutes..1 hour."""
        return self.p_end * self.human_hour + (1.0 - self.p_end) * self.tool_hour

    @property
    def next_soon(self) -> float:
        """Chance that the next request comes within 5 minutes."""
        return self.p_end * self.human_soon + (1.0 - self.p_end) * self.tool_soon


def _shares(samples: Sequence[float], prior: tuple[float, float]) -> tuple[float, float]:
    if not samples:
        return prior
    soon = sum(1 for g in samples if g < FIVE_MINUTES)
    hour = sum(1 for g in samples if FIVE_MINUTES <= g < ONE_HOUR)
    return soon / len(samples), hour / len(samples)


def forecast(session: Pacing, tenant: Pacing) -> Forecast:
    """The forecast from a session's and its tenant's pacing (module docstring)."""
    human_soon, human_hour = _shares((*session.human, *tenant.human), HUMAN_PRIOR)
    tool_soon, tool_hour = _shares((*session.tool, *tenant.tool), TOOL_PRIOR)
    responses = session.responses + tenant.responses
    p_end = (session.ends + tenant.ends) / responses if responses else END_PRIOR
    return Forecast(p_end, human_soon, human_hour, tool_soon, tool_hour)


@dataclass(frozen=True, slots=True)
class TtlChoice:
    """The TTLs for one request and the numbers behind them (for notes and explanations)."""

    shared: Ttl
    anchor: Ttl
    tail: Ttl
    next_hour: float
    write_tail: bool = True
    """False when the tail is predicted not to be read (`tail_pays`): no marker writes past the
    anchor."""


BREAK_EVEN: Final = (WRITE_1H - WRITE_5M) / (WRITE_5M - READ)
"""`next_hour` above which a 1h tail pays (0.652)."""


def tail_pays(prediction: Forecast, tail: Ttl) -> bool:
    """Whether writing the tail with `tail`'s TTL beats sending it uncached (module docstring,
    cost guard): the write's premium over the base price (0.25 for 5m, 1.0 for 1h) against the
    re-write it saves (1.25 - 0.1) times the chance the next request reads it (comes while
    the entry lives)."""
    read = prediction.next_soon + (prediction.next_hour if tail == "1h" else 0.0)
    premium = (WRITE_1H if tail == "1h" else WRITE_5M) - 1.0
    return read * (WRITE_5M - READ) > premium


def choose_ttls(
    prediction: Forecast, *, agent: bool = False, expired: bool = False, shared_live: bool = False
) -> TtlChoice:
    """`(shared prefix, anchor, tail)` TTLs and whether the tail is written (module docstring)."""
    chance = prediction.next_hour
    tail: Ttl = "1h" if not agent and chance > BREAK_EVEN else "5m"
    anchor: Ttl = "1h" if not expired or tail == "1h" else "5m"
    shared: Ttl = "1h" if tail == "1h" or (shared_live and chance > SHARED_MIN_CHANCE) else "5m"
    # a subagent is machine-paced: its next request comes in seconds, whatever people do
    return TtlChoice(shared, anchor, tail, chance, agent or tail_pays(prediction, tail))

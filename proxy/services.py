"""`Services`: the long-lived objects a stage may use, built once per app in `proxy.app`."""

from __future__ import annotations

from dataclasses import dataclass
from typing import Any

from proxy.metrics import Metrics
from proxy.settings import Settings


@dataclass(slots=True)
class Services:
    settings: Settings
    metrics: Metrics
    rules: Any = None
    """The loaded `RuleSet` (proxy.rules), `None` until rules are loaded."""
    store: Any = None
    """The `SessionStore` (proxy.store), `None` when sessions are off."""

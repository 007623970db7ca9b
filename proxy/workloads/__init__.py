"""The workload suite: deterministic generators of client traces, the oracle, replay plumbing.

- `trace.py`: the JSONL trace format; `text.py`, `script.py`: seeded content and session plans;
  `anthropic_gen.py`, `openai_gen.py`: render plans with real clients' cache-breaking quirks;
  `suite.py`: the named workloads (`python -m proxy.workloads write|check|list`).
- `stable.py`, `oracle.py`: the optimum a proxy could reach (simulator rules, future known).
- `strategies.py`, `usage.py`, `runner.py`, `report.py`: what `promptcache replay` runs and prints.
Generators use no wall clock and no I/O; only `suite.ensure_traces` and the CLI write files.
"""

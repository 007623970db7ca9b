"""The upstream simulator: a fake Anthropic + OpenAI API with faithful prompt-cache accounting.

It is the judge of every cache-hit number promptcache reports, so it shares no code with
`proxy.pipeline` or `proxy.providers`: it parses requests, renders prefixes and counts tokens on
its own. Modules (pure cores first, aiohttp last):

- `clock`   real or manual time
- `config`  per-model table (`rules/simulator.yaml`)
- `tokens`  offline `o200k_base` counting (the documented approximation)
- `cache`   entries by tenant, TTL / idle expiry, commit at response start
- `anthropic`, `anthropic_wire`  Messages validation, prefix rendering, accounting; wire shapes
- `openai`, `openai_wire`        Chat / Responses rendering, routing, accounting; wire shapes
- `replies` deterministic text, scripted text (`x-sim-reply`, `[[reply:]]`) or tool calls
- `errors`  rejections and the providers' error bodies
- `app`     `create_sim_app`, `start_sim`, routes, admin endpoints
- `cli`     `promptcache simulate`
"""

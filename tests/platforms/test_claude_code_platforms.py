"""Claude Code itself on Vertex AI and on Bedrock through promptcache (README "Other platforms"),
offline against the simulator playing each platform: the second turn reads what the first wrote.

Marker `clients`: needs the npm Claude Code install in `.clients/` (`PROMPTCACHE_CLIENTS_DIR`).
"""

from __future__ import annotations

import asyncio
from pathlib import Path

import orjson
import pytest

from tests.clients.harness import INSTALLS, InstallError, base_env, ensure_installed

pytestmark = pytest.mark.clients

PLATFORMS = {
    # CLAUDE_CODE_SKIP_VERTEX_AUTH: no Google credentials offline; the bearer goes as a header
    "vertex": lambda url: {
        "CLAUDE_CODE_USE_VERTEX": "1",
        "CLAUDE_CODE_SKIP_VERTEX_AUTH": "1",
        "CLOUD_ML_REGION": "us-east5",
        "ANTHROPIC_VERTEX_PROJECT_ID": "proj-1",
        "ANTHROPIC_VERTEX_BASE_URL": url + "/v1",
        "ANTHROPIC_CUSTOM_HEADERS": "Authorization: Bearer ya29.offline",
    },
    "bedrock": lambda url: {
        "CLAUDE_CODE_USE_BEDROCK": "1",
        "AWS_REGION": "us-east-1",
        "AWS_BEARER_TOKEN_BEDROCK": "bedrock-offline-key",
        "ANTHROPIC_BEDROCK_BASE_URL": url,
    },
}


async def _claude(binary: str, env: dict[str, str], work: Path, *extra: str) -> dict:
    process = await asyncio.create_subprocess_exec(
        binary,
        "-p",
        "Say hello",
        "--output-format",
        "json",
        *extra,
        env=env,
        cwd=work,
        stdout=asyncio.subprocess.PIPE,
        stderr=asyncio.subprocess.PIPE,
    )
    stdout, stderr = await asyncio.wait_for(process.communicate(), 180)
    assert process.returncode == 0, stderr[-600:]
    return orjson.loads(stdout)


@pytest.mark.parametrize("platform", sorted(PLATFORMS))
async def test_claude_code_on_the_platform_reads_its_prefix(
    platform: str, make_sim, make_proxy, tmp_path: Path
) -> None:
    try:
        ensure_installed("npm")
    except InstallError as exc:
        pytest.skip(f"Claude Code could not be installed into .clients/: {exc}")
    binary = str(INSTALLS["npm"].path / "node_modules" / ".bin" / "claude")
    sim = await make_sim()
    proxy = await make_proxy(upstream=sim)
    home, work = tmp_path / "home", tmp_path / "work"
    (home / "tmp").mkdir(parents=True)
    work.mkdir()
    env = base_env(home) | PLATFORMS[platform](proxy.url)
    env |= {"DISABLE_TELEMETRY": "1", "CLAUDE_CODE_DISABLE_NONESSENTIAL_TRAFFIC": "1", "DISABLE_AUTOUPDATER": "1"}
    first = await _claude(binary, env, work)
    second = await _claude(binary, env, work, "--continue")
    assert not first["is_error"] and not second["is_error"], (first.get("result"), second.get("result"))
    written = first["usage"]["cache_creation_input_tokens"]
    assert written > 0 and second["usage"]["cache_read_input_tokens"] == written

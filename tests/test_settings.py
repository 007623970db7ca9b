"""Settings: file < environment < flags; invalid values name the setting and its source."""

from __future__ import annotations

import os
import subprocess
import sys
from pathlib import Path

import pytest

from proxy.settings import SettingsError, load_settings


def test_precedence_file_env_flags(tmp_path: Path) -> None:
    config = tmp_path / "promptcache.yaml"
    config.write_text("port: 9001\nmode: observe\nsession_headers: [x-a]\n")
    settings = load_settings(config, environ={"PROMPTCACHE_PORT": "9002", "PROMPTCACHE_SESSION_HEADERS": "x-b, x-c"})
    assert (settings.port, settings.mode, settings.session_headers) == (9002, "observe", ("x-b", "x-c"))
    flagged = load_settings(config, environ={"PROMPTCACHE_PORT": "9002"}, overrides={"port": 9003, "host": None})
    assert (flagged.port, flagged.host) == (9003, "127.0.0.1")


def test_invalid_settings_name_key_and_source(tmp_path: Path) -> None:
    config = tmp_path / "bad.yaml"
    config.write_text("port: 70000\nbogus: 1\n")
    with pytest.raises(SettingsError) as info:
        load_settings(config, environ={"PROMPTCACHE_UPSTREAM": "ftp://x"})
    lines = str(info.value).splitlines()
    assert lines == [
        f"invalid setting port ({config}: port): Input should be less than or equal to 65535",
        "invalid setting upstream (PROMPTCACHE_UPSTREAM): "
        "Value error, must be auto, real, sim or an http(s):// base URL",
        f"invalid setting bogus ({config}: bogus): unknown setting",
    ]


def test_unknown_setting_suggests_the_nearest_name(tmp_path: Path) -> None:
    config = tmp_path / "typo.yaml"
    config.write_text("admin_prot: 9464\nanthropic_capabilities: {strip_tl: true}\n")
    with pytest.raises(SettingsError) as info:
        load_settings(config, environ={"PROMPTCACHE_LOG_LEVL": "info"})
    assert str(info.value).splitlines() == [
        f"invalid setting anthropic_capabilities.strip_tl ({config}: anthropic_capabilities): "
        'unknown setting; did you mean "strip_ttl"?',
        f'invalid setting admin_prot ({config}: admin_prot): unknown setting; did you mean "admin_port"?',
        'invalid setting log_levl (PROMPTCACHE_LOG_LEVL): unknown setting; did you mean "PROMPTCACHE_LOG_LEVEL"?',
    ]


def test_log_level_and_format_any_case() -> None:
    settings = load_settings(environ={"PROMPTCACHE_LOG_LEVEL": "debug", "PROMPTCACHE_LOG_FORMAT": "JSON"})
    assert (settings.log_level, settings.log_format) == ("DEBUG", "json")
    with pytest.raises(SettingsError) as info:
        load_settings(environ={"PROMPTCACHE_LOG_FORMAT": "xml"})
    assert str(info.value) == "invalid setting log_format (PROMPTCACHE_LOG_FORMAT): Input should be 'text' or 'json'"


def test_serve_exits_2_on_invalid_setting() -> None:
    result = subprocess.run(
        [sys.executable, "-m", "proxy", "serve", "--port", "-1"], capture_output=True, text=True, timeout=60
    )
    assert result.returncode == 2
    assert "invalid setting port (--port): Input should be greater than or equal to 0" in result.stderr


def test_serve_exits_2_on_an_unknown_profile(tmp_path: Path) -> None:
    env = {k: v for k, v in os.environ.items() if not k.startswith("PROMPTCACHE_")}  # e.g. the suite's CLIENTS_DIR
    env.update({"PROMPTCACHE_ANTHROPIC_PROFILE": "vertexx", "PROMPTCACHE_STATE_DIR": str(tmp_path)})
    result = subprocess.run(
        [sys.executable, "-m", "proxy", "serve", "--port", "0", "--upstream", "http://127.0.0.1:9"],
        capture_output=True, text=True, timeout=60, env=env,
    )
    assert result.returncode == 2, result.stderr
    assert "unknown anthropic profile 'vertexx'" in result.stderr
    assert "Traceback" not in result.stderr


def test_capabilities_and_headers_accept_lists_and_comma_strings(tmp_path: Path) -> None:
    config = tmp_path / "c.yaml"
    config.write_text("openai_capabilities: [no_tool_message_markers]\nsession_headers: x-a, x-b\n")
    settings = load_settings(config, environ={"PROMPTCACHE_ANTHROPIC_CAPABILITIES": "strip_ttl,strip_scope"})
    assert settings.anthropic_capabilities.model_dump() == {
        "strip_ttl": True,
        "strip_scope": True,
        "no_tool_message_markers": False,
    }
    assert settings.openai_capabilities.no_tool_message_markers is True
    assert settings.session_headers == ("x-a", "x-b")


def test_per_provider_settings_are_one_mapping(tmp_path: Path) -> None:
    from prometheus_client import CollectorRegistry

    from proxy.metrics import Metrics
    from proxy.pipeline.support import capabilities_for
    from proxy.providers import ANTHROPIC, OPENAI_CHAT
    from proxy.services import Services
    from proxy.settings import ProviderSettings, UpstreamCapabilities

    config = tmp_path / "c.yaml"
    config.write_text("openai_profile: litellm\nopenai_capabilities: [no_tool_message_markers]\n")
    settings = load_settings(config, environ={"PROMPTCACHE_ANTHROPIC_UPSTREAM": "http://127.0.0.1:9/"})
    assert settings.providers == {
        "anthropic": ProviderSettings(
            upstream="http://127.0.0.1:9", profile="direct", capabilities=UpstreamCapabilities()
        ),
        "openai": ProviderSettings(
            upstream="https://api.openai.com",
            profile="litellm",
            capabilities=UpstreamCapabilities(no_tool_message_markers=True),
        ),
    }
    services = Services(settings=settings, metrics=Metrics(CollectorRegistry()))
    assert capabilities_for(services, OPENAI_CHAT).no_tool_message_markers is True
    assert capabilities_for(services, ANTHROPIC).no_tool_message_markers is False


def test_short_secret_is_refused() -> None:
    with pytest.raises(SettingsError) as info:
        load_settings(environ={"PROMPTCACHE_SECRET": "short"})
    assert str(info.value) == (
        "invalid setting secret (PROMPTCACHE_SECRET): "
        "Value error, must be at least 32 characters (or empty to generate one)"
    )

"""Tenants: keyed hashes of credential and upstream host; the secret file."""

from __future__ import annotations

import hashlib
import hmac
import os
import stat
from pathlib import Path

from multidict import CIMultiDict

from proxy.session_identity import SessionState, upstream_hosts
from proxy.settings import Settings
from proxy.tenant import credential_of, load_secret, tenant_id


def test_tenant_id_is_hmac_of_host_and_credential() -> None:
    expected = hmac.new(b"secret", b"api.anthropic.com\x00sk-1", hashlib.sha256).hexdigest()[:32]
    assert tenant_id(b"secret", "sk-1", "api.anthropic.com") == expected
    assert tenant_id(b"secret", "sk-1", "other.host") != expected
    assert tenant_id(b"secret", "sk-2", "api.anthropic.com") != expected
    assert tenant_id(b"other-secret", "sk-1", "api.anthropic.com") != expected


def test_credential_header_precedence() -> None:
    assert credential_of(CIMultiDict({"X-Api-Key": "k", "Authorization": "Bearer b"})) == "k"
    assert credential_of(CIMultiDict({"Authorization": "Bearer b"})) == "b"
    assert credential_of(CIMultiDict({"Authorization": "bearer  b "})) == "b"
    assert credential_of(CIMultiDict({"api-key": "azure"})) == "azure"
    assert credential_of(CIMultiDict()) == ""


def test_secret_file_created_once_with_0600(tmp_path: Path) -> None:
    state = tmp_path / "state"
    first = load_secret("", state)
    path = state / "secret"
    assert stat.S_IMODE(os.stat(path).st_mode) == 0o600
    assert len(first) == 64 and load_secret("", state) == first
    assert [p.name for p in state.iterdir()] == ["secret"]  # no temp file left behind


def test_configured_secret_wins_and_writes_nothing(tmp_path: Path) -> None:
    assert load_secret("configured", tmp_path / "state") == b"configured"
    assert not (tmp_path / "state").exists()


def test_loose_permissions_are_tightened(tmp_path: Path) -> None:
    path = tmp_path / "secret"
    path.write_text("a" * 64)
    path.chmod(0o644)
    assert load_secret("", tmp_path) == b"a" * 64
    assert stat.S_IMODE(os.stat(path).st_mode) == 0o600


def test_short_secret_is_replaced(tmp_path: Path) -> None:
    (tmp_path / "secret").write_text("short")
    secret = load_secret("", tmp_path)
    assert len(secret) == 64 and secret != b"short"


async def test_memory_store_uses_a_process_secret(tmp_path: Path) -> None:
    settings = Settings(state_dir=tmp_path / "state")
    a = await SessionState.start(settings, is_persistent=False)
    b = await SessionState.start(settings, is_persistent=False)
    assert a.secret != b.secret and not (tmp_path / "state").exists()
    persistent = await SessionState.start(settings)
    assert persistent.secret == (tmp_path / "state" / "secret").read_bytes().strip()


def test_upstream_hosts() -> None:
    assert upstream_hosts(Settings()) == {"anthropic": "api.anthropic.com", "openai": "api.openai.com"}
    assert upstream_hosts(Settings(upstream="http://127.0.0.1:9000/")) == {
        "anthropic": "127.0.0.1:9000",
        "openai": "127.0.0.1:9000",
    }

"""Tenants: keyed hashes of credential and upstream host; the secret file."""

from __future__ import annotations

import hashlib
import hmac
import os
import stat
from pathlib import Path

import pytest
from hypothesis import given
from hypothesis import strategies as st
from multidict import CIMultiDict

from proxy.session_identity import SessionState, upstream_hosts
from proxy.settings import Settings
from proxy.tenant import TenantKey, credential_of, load_secret, tenant_id


def test_tenant_id_is_hmac_of_host_and_credential() -> None:
    expected = hmac.new(b"secret", b"api.anthropic.com\x00sk-1", hashlib.sha256).hexdigest()[:32]
    assert tenant_id(b"secret", "sk-1", "api.anthropic.com") == expected
    assert tenant_id(b"secret", "sk-1", "other.host") != expected
    assert tenant_id(b"secret", "sk-2", "api.anthropic.com") != expected
    assert tenant_id(b"other-secret", "sk-1", "api.anthropic.com") != expected


def test_a_credential_that_is_not_utf8_is_hashed_as_the_bytes_it_came_as() -> None:
    # aiohttp hands such a header value over decoded with `surrogateescape`
    credential = b"sk-ant-\xe9\xff".decode("utf-8", "surrogateescape")
    expected = hmac.new(b"secret", b"api.anthropic.com\x00sk-ant-\xe9\xff", hashlib.sha256).hexdigest()[:32]
    assert tenant_id(b"secret", credential, "api.anthropic.com") == expected
    assert TenantKey(b"secret").tenant(credential, "api.anthropic.com") == expected
    other = b"sk-ant-\xe9\xfe".decode("utf-8", "surrogateescape")
    assert tenant_id(b"secret", other, "api.anthropic.com") != expected


@pytest.mark.parametrize("secret", [b"", b"s", b"3f" * 32, b"k" * 64, b"k" * 65, bytes(range(256))])
def test_tenant_key_is_the_hmac_for_every_secret_length(secret: bytes) -> None:
    # keys up to, at and beyond SHA-256's 64-byte block (a longer key is hashed first)
    expected = hmac.new(secret, "api.anthropic.com\x00sk-ant-é".encode(), hashlib.sha256).hexdigest()[:32]
    key = TenantKey(secret)
    assert key.tenant("sk-ant-é", "api.anthropic.com") == expected
    assert key.tenant("sk-ant-é", "api.anthropic.com") == expected  # the pads are copied, not consumed
    assert key.tenant("", "api.openai.com") == tenant_id(secret, "", "api.openai.com")


@given(st.binary(max_size=150), st.text(max_size=80), st.text(max_size=30))
def test_tenant_key_equals_tenant_id(secret: bytes, credential: str, host: str) -> None:
    assert TenantKey(secret).tenant(credential, host) == tenant_id(secret, credential, host)


def test_session_state_rebuilds_its_tenant_key_when_the_secret_changes() -> None:
    state = SessionState(b"first-secret", (), {"anthropic": "api.anthropic.com"})
    headers = CIMultiDict({"x-api-key": "sk-1"})
    assert state.tenant_of("anthropic", headers) == tenant_id(b"first-secret", "sk-1", "api.anthropic.com")
    state.secret = b"second-secret"
    assert state.tenant_of("anthropic", headers) == tenant_id(b"second-secret", "sk-1", "api.anthropic.com")


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

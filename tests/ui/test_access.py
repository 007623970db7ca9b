"""Access to the admin surface: `admin_token` on every admin route, and no start on a non-loopback
admin address without one."""

from __future__ import annotations

import subprocess
import sys

import aiohttp
import pytest

from proxy.admin import admin_exposure_error, is_loopback
from proxy.settings import Settings, SettingsError, load_settings
from tests.ui.conftest import KEY, SESSION, TOKEN, drive_session

ADMIN_PATHS = ("/metrics", "/debug/sessions", f"/debug/sessions/{SESSION}", "/ui/", f"/ui/sessions/{SESSION}")


@pytest.mark.parametrize("host", ["127.0.0.1", "127.0.0.2", "::1", "[::1]", "localhost"])
def test_loopback_addresses(host: str) -> None:
    assert is_loopback(host)


@pytest.mark.parametrize("host", ["0.0.0.0", "::", "", "10.0.0.7", "example.com", "192.168.1.2"])
def test_non_loopback_addresses(host: str) -> None:
    assert not is_loopback(host)


def test_non_loopback_admin_needs_a_token() -> None:
    with pytest.raises(SettingsError) as info:
        load_settings(environ={"PROMPTCACHE_HOST": "0.0.0.0"})
    assert str(info.value) == (
        "invalid setting admin_token: required when the admin routes (/metrics, /debug, /ui) listen on the "
        "non-loopback address '0.0.0.0' (host); set admin_token, or listen on 127.0.0.1 (from PROMPTCACHE_HOST)"
    )
    with pytest.raises(SettingsError, match=r"'10\.1\.2\.3' \(admin_host\).*\(from --admin-host\)"):
        load_settings(environ={}, overrides={"admin_port": 9464, "admin_host": "10.1.2.3"})
    # With a token, or with the admin listener on loopback, it starts.
    assert load_settings(environ={"PROMPTCACHE_HOST": "0.0.0.0", "PROMPTCACHE_ADMIN_TOKEN": TOKEN}).admin_token == TOKEN
    local_admin = load_settings(
        environ={"PROMPTCACHE_HOST": "0.0.0.0", "PROMPTCACHE_ADMIN_PORT": "9464", "PROMPTCACHE_ADMIN_HOST": "127.0.0.1"}
    )
    assert admin_exposure_error(local_admin) is None
    # admin_host without an admin port means nothing: the admin routes are on the main listener.
    assert admin_exposure_error(Settings(host="0.0.0.0", admin_host="127.0.0.1")) is not None


def test_serve_refuses_to_start() -> None:
    done = subprocess.run(
        [sys.executable, "-m", "proxy", "serve", "--host", "0.0.0.0", "--port", "0", "--store", "memory://"],
        capture_output=True,
        text=True,
        timeout=60,
        env={"PATH": "/usr/bin:/bin", "HOME": "/tmp"},
    )
    assert done.returncode == 2
    assert "admin_token: required" in done.stderr and "(from --host)" in done.stderr


async def test_token_by_bearer_or_query_on_every_admin_route(admin_proxy) -> None:
    proxy = await admin_proxy(admin_token=TOKEN)
    await drive_session(proxy.url, turns=2)
    caller = {"x-api-key": KEY}
    async with aiohttp.ClientSession() as http:
        for path in ADMIN_PATHS:
            async with http.get(proxy.admin_url + path, headers=caller) as r:
                assert r.status == 401, path
                assert r.headers["WWW-Authenticate"] == 'Bearer realm="promptcache admin"'
            async with http.get(proxy.admin_url + path, headers={**caller, "Authorization": "Bearer nope"}) as r:
                assert r.status == 401, path
            async with http.get(proxy.admin_url + path, headers={**caller, "Authorization": f"Bearer {TOKEN}"}) as r:
                assert r.status == 200, path
            async with http.get(proxy.admin_url + path, params={"token": TOKEN}, headers=caller) as r:
                assert r.status == 200, path
        async with http.get(proxy.admin_url + "/healthz") as r:
            assert r.status == 200
        # The admin bearer is not the caller's credential: the tenant still comes from x-api-key.
        async with http.get(
            proxy.admin_url + "/debug/sessions", headers={**caller, "Authorization": f"Bearer {TOKEN}"}
        ) as r:
            listed = (await r.json())["sessions"]
        assert [s["requests"] for s in listed] == [2]


async def test_without_a_token_cross_tenant_pages_need_the_generated_one(admin_proxy) -> None:
    """No `admin_token` on loopback: `/metrics` and the tenant-scoped `/debug` stay open, the
    pages listing every tenant's sessions need the token generated at start."""
    proxy = await admin_proxy()
    await drive_session(proxy.url, turns=2)
    await drive_session(proxy.url, turns=1, key="sk-ant-ui-other-tenant-key-88", session="other-conv")
    generated = proxy.services.ui_token
    assert len(generated) >= 40
    async with aiohttp.ClientSession() as http:
        for path in ("/ui/", f"/ui/sessions/{SESSION}", "/ui/sessions/other-conv"):
            async with http.get(proxy.admin_url + path, headers={"x-api-key": KEY}) as r:
                assert r.status == 401, path
                assert r.headers["WWW-Authenticate"] == 'Bearer realm="promptcache admin"'
                assert "conv" not in await r.text()
            async with http.get(proxy.admin_url + path, params={"token": "wrong"}) as r:
                assert r.status == 401, path
            async with http.get(proxy.admin_url + path, params={"token": generated}) as r:
                assert r.status == 200, path
            async with http.get(proxy.admin_url + path, headers={"Authorization": f"Bearer {generated}"}) as r:
                assert r.status == 200, path
        async with http.get(proxy.admin_url + "/ui/", params={"token": generated}) as r:
            listing = await r.text()
        from proxy.session_identity import explicit_id

        # the admin view lists both tenants' sessions
        assert explicit_id(SESSION) in listing and explicit_id("other-conv") in listing
        async with http.get(proxy.admin_url + "/metrics") as r:
            assert r.status == 200
        # /debug answers the caller's own tenant only, without any admin credential
        async with http.get(proxy.admin_url + "/debug/sessions", headers={"x-api-key": KEY}) as r:
            assert r.status == 200
            mine = (await r.json())["sessions"]
        assert [s["requests"] for s in mine] == [2]
        async with http.get(proxy.admin_url + "/debug/sessions") as r:
            assert (r.status, await r.json()) == (200, {"sessions": []})
        async with http.get(proxy.admin_url + "/debug/sessions/other-conv", headers={"x-api-key": KEY}) as r:
            assert r.status == 404
        async with http.get(proxy.admin_url + "/ui", allow_redirects=False) as r:
            assert (r.status, r.headers["Location"]) == (302, "/ui/")


def test_serve_prints_the_generated_token_once_in_its_banner_and_nowhere_else(tmp_path) -> None:
    """`serve` on loopback without `admin_token`: the banner's forensic-map URL opens `/ui/`;
    the token is in that one line and in no log line or state file."""
    import signal

    env = {
        "PATH": "/usr/bin:/bin",
        "HOME": str(tmp_path),
        "XDG_STATE_HOME": str(tmp_path / "state"),
        "PROMPTCACHE_LOG_LEVEL": "DEBUG",
    }
    argv = [sys.executable, "-m", "proxy", "serve", "--port", "0", "--upstream", "sim"]
    proc = subprocess.Popen(argv, stdout=subprocess.PIPE, stderr=subprocess.PIPE, text=True, env=env)
    try:
        assert proc.stdout is not None
        banner = []
        while not banner or not banner[-1].startswith("  forensic map: "):
            line = proc.stdout.readline()
            assert line, "serve exited before its banner"
            banner.append(line.rstrip("\n"))
        url = banner[0].split(" listening on ")[1].split(" ")[0]
        page = banner[-1].removeprefix("  forensic map: ")
        assert page.startswith(f"{url}/ui/?token=")
        token = page.split("?token=")[1]
        import urllib.error
        import urllib.request

        with urllib.request.urlopen(page, timeout=30) as r:
            assert r.status == 200
        try:
            urllib.request.urlopen(f"{url}/ui/", timeout=30)
            raise AssertionError("/ui/ answered without the token")
        except urllib.error.HTTPError as exc:
            assert exc.code == 401
    finally:
        proc.send_signal(signal.SIGTERM)
        out, err = proc.communicate(timeout=60)
    assert token not in out and token not in err
    from pathlib import Path

    for path in Path(tmp_path).rglob("*"):
        if path.is_file():
            assert token.encode() not in path.read_bytes(), path


async def test_main_listener_guards_admin_routes_without_an_admin_port(make_proxy, fake_upstream) -> None:
    proxy = await make_proxy(upstream=fake_upstream.url, admin_token=TOKEN)
    async with aiohttp.ClientSession() as http:
        for path in ADMIN_PATHS:
            async with http.get(proxy.url + path) as r:
                assert r.status == 401, path
            async with http.get(proxy.url + path, params={"token": TOKEN}) as r:
                assert r.status in (200, 404), path


async def test_with_an_admin_port_the_main_listener_serves_no_admin_route(admin_proxy) -> None:
    proxy = await admin_proxy(admin_token=TOKEN)
    async with aiohttp.ClientSession() as http:
        for path in ("/ui", "/ui/", f"/ui/sessions/{SESSION}", "/debug/sessions"):
            async with http.get(proxy.url + path, params={"token": TOKEN}) as r:
                assert r.status == 404, path
                assert (await r.json())["error"]["type"] == "not_found_error"


async def test_history_off(admin_proxy) -> None:
    proxy = await admin_proxy(history_sessions=0)
    await drive_session(proxy.url, turns=2)
    assert len(proxy.services.last_measurements) == 0
    async with aiohttp.ClientSession() as http:
        async with http.get(proxy.admin_url + "/debug/sessions", headers={"x-api-key": KEY}) as r:
            assert (await r.json()) == {"sessions": []}
        async with http.get(proxy.admin_url + f"/debug/sessions/{SESSION}", headers={"x-api-key": KEY}) as r:
            assert r.status == 200  # the stored record still answers
            assert (await r.json())["summary"] is None

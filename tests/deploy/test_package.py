"""A non-editable install works outside the repository: a wheel built from a copy of the source,
installed into a fresh virtualenv, replays the built-in workloads and finds its rules.

The virtualenv reuses this environment's site-packages for the dependencies (a `.pth` line, so
their own `.pth` files, among them the editable hook of this checkout, are not run) and gets
promptcache itself only from the wheel (`pip install --no-deps --no-index`)."""

from __future__ import annotations

import os
import shutil
import subprocess
import sys
import sysconfig
import zipfile
from dataclasses import dataclass
from pathlib import Path

import orjson
import pytest

from proxy.rules import load_rules
from proxy.workloads.suite import SUITE

ROOT = Path(__file__).resolve().parents[2]
DATA = "promptcache-0.1.0.data/data/share/promptcache/"


@dataclass(frozen=True)
class Install:
    wheel: Path
    venv: Path
    outside: Path
    """An empty folder outside the repository, the working directory of every command."""

    def run(self, *args: str) -> subprocess.CompletedProcess[str]:
        env = {k: v for k, v in os.environ.items() if k not in ("PYTHONPATH", "VIRTUAL_ENV")}
        return subprocess.run(
            args, cwd=self.outside, env=env, capture_output=True, text=True, timeout=300, check=False
        )

    def python(self, code: str) -> str:
        result = self.run(str(self.venv / "bin" / "python"), "-c", code)
        assert result.returncode == 0, result.stderr
        return result.stdout

    def promptcache(self, *args: str) -> subprocess.CompletedProcess[str]:
        return self.run(str(self.venv / "bin" / "promptcache"), *args)


@pytest.fixture(scope="module")
def install(tmp_path_factory: pytest.TempPathFactory) -> Install:
    base = tmp_path_factory.mktemp("package")
    source = base / "source"
    source.mkdir()
    for name in ("pyproject.toml", "README.md"):
        shutil.copy(ROOT / name, source / name)
    for name in ("proxy", "rules", "workloads"):
        shutil.copytree(ROOT / name, source / name, ignore=shutil.ignore_patterns("__pycache__"))
    dist = base / "dist"
    pip = [sys.executable, "-m", "pip", "--disable-pip-version-check", "-q"]
    built = subprocess.run(
        [*pip, "wheel", "--no-build-isolation", "--no-deps", "-w", str(dist), str(source)],
        capture_output=True, text=True, timeout=300, check=False,
    )
    assert built.returncode == 0, built.stderr
    [wheel] = dist.glob("promptcache-*.whl")
    venv = base / "venv"
    subprocess.run([sys.executable, "-m", "venv", "--without-pip", str(venv)], check=True, timeout=120)
    purelib = Path(sysconfig.get_paths(vars={"base": str(venv), "platbase": str(venv)})["purelib"])
    (purelib / "outer-site-packages.pth").write_text(sysconfig.get_paths()["purelib"] + "\n")
    outside = base / "outside"
    outside.mkdir()
    result = Install(wheel, venv, outside)
    installed = result.run(
        str(venv / "bin" / "python"), "-m", "pip", "--disable-pip-version-check", "-q",
        "install", "--no-deps", "--no-index", str(wheel),
    )
    assert installed.returncode == 0, installed.stderr
    return result


def test_wheel_ships_the_rules_and_the_committed_workloads(install: Install) -> None:
    names = zipfile.ZipFile(install.wheel).namelist()
    data = sorted(n.removeprefix(DATA) for n in names if n.startswith(DATA))
    expected = sorted(
        str(p.relative_to(ROOT))
        for p in [
            *(ROOT / "rules").glob("*.yaml"),
            ROOT / "rules" / "README.md",
            *(ROOT / "workloads").glob("*.jsonl"),
            ROOT / "workloads" / "README.md",
            *(ROOT / "workloads" / "clients").glob("*.jsonl"),
        ]
    )
    assert data == expected
    committed = {f"workloads/{w.name}.jsonl" for w in SUITE if w.committed}
    assert committed <= set(data)
    assert "workloads/long-context-growth.jsonl" not in data
    assert not [n for n in names if n.startswith(("tests/", "bench/", "deploy/"))]


def test_installed_package_finds_its_data_outside_the_repository(install: Install) -> None:
    out = install.python(
        "import proxy, proxy.paths as p, proxy.rules as r, proxy.pricing as c, proxy.workloads.suite as s\n"
        "print(proxy.__file__); print(p.packaged_rules_dir()); print(p.packaged_workloads_dir())\n"
        "print(r.PACKAGED_DIR); print(c.DEFAULT_PATH); print(s.COMMITTED_DIR)\n"
        "print(len(r.load_rules().rules))\n"
    )
    share = install.venv / "share" / "promptcache"
    site = Path(sysconfig.get_paths(vars={"base": str(install.venv), "platbase": str(install.venv)})["purelib"])
    assert out.splitlines() == [
        str(site / "proxy" / "__init__.py"),
        str(share / "rules"),
        str(share / "workloads"),
        str(share / "rules"),
        str(share / "rules" / "pricing.yaml"),
        str(share / "workloads"),
        str(len(load_rules().rules)),
    ]
    check = install.promptcache("check-rules")
    assert (check.returncode, check.stderr) == (0, "")
    assert check.stdout.startswith(f"ok: {len(load_rules().rules)} rules, ")


def test_replay_suite_from_the_wheel(install: Install) -> None:
    cache = install.outside / "cache-wheel"
    from_wheel = install.promptcache("replay", "suite", "--json", "--quiet", "--cache-dir", str(cache))
    assert from_wheel.returncode == 0, from_wheel.stderr
    report = orjson.loads(from_wheel.stdout)
    assert [t["trace"] for t in report["traces"]] == [w.name for w in SUITE]
    assert sorted(p.name for p in cache.iterdir()) == sorted(f"{w.name}.jsonl" for w in SUITE if not w.committed)
    for trace, workload in zip(report["traces"], SUITE, strict=True):
        if workload.committed:
            lines = (ROOT / "workloads" / f"{workload.name}.jsonl").read_bytes().count(b"\n")
            assert trace["requests"] == lines - 1, workload.name
    assert [(t["stage_errors"], t["strategies"]["promptcache"]["errors"]) for t in report["traces"]] == [
        (0, 0)
    ] * len(SUITE)
    # Per trace, the installed copy gives what the source checkout gives (two workloads, to keep
    # the suite's one full replay the only long one; traces replay independently).
    from_source = subprocess.run(
        [sys.executable, "-m", "proxy", "replay", "no-markers", "openai-chat-agent", "--json", "--quiet",
         "--cache-dir", str(install.outside / "cache-source")],
        cwd=ROOT, capture_output=True, text=True, timeout=300, check=False,
    )
    assert from_source.returncode == 0, from_source.stderr
    by_name = {t["trace"]: t for t in report["traces"]}
    source = orjson.loads(from_source.stdout)["traces"]
    assert [t["trace"] for t in source] == ["no-markers", "openai-chat-agent"]
    assert [by_name[t["trace"]] for t in source] == source


def test_a_committed_workload_missing_from_the_install_is_generated_with_the_committed_bytes(
    install: Install,
) -> None:
    shipped = install.venv / "share" / "promptcache" / "workloads" / "no-markers.jsonl"
    shipped.unlink()
    cache = install.outside / "cache-missing"
    result = install.promptcache(
        "replay", "no-markers", "--strategy", "none", "--json", "--quiet", "--cache-dir", str(cache)
    )
    assert result.returncode == 0, result.stderr
    assert [p.name for p in cache.iterdir()] == ["no-markers.jsonl"]
    assert (cache / "no-markers.jsonl").read_bytes() == (ROOT / "workloads" / "no-markers.jsonl").read_bytes()
    assert orjson.loads(result.stdout)["traces"][0]["requests"] == 12


def test_wheel_ships_the_forensic_map_assets(install: Install, tmp_path: Path) -> None:
    names = zipfile.ZipFile(install.wheel).namelist()
    assert {"proxy/ui/map.js", "proxy/ui/map.css"} <= set(names)
    a, b = tmp_path / "a.json", tmp_path / "b.json"
    a.write_text('{"model": "claude-sonnet-4-6", "messages": [{"role": "user", "content": "hi"}]}')
    b.write_text('{"model": "claude-sonnet-4-6", "messages": [{"role": "user", "content": "ho"}]}')
    out = tmp_path / "map.html"
    done = install.promptcache("explain", str(a), str(b), "--html", str(out))
    assert done.returncode == 1, done.stderr
    assert "window.promptcacheWhatIf" in out.read_text()

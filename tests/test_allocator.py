"""`proxy.allocator`: the glibc settings are applied (read back from glibc itself, in a fresh
process each: `mallopt` is process-wide), `malloc_trim` returns free heap pages, and the trimmer
trims while requests are served and once after they stop."""

from __future__ import annotations

import subprocess
import sys
import textwrap

import pytest

from proxy import allocator
from proxy.settings import Settings, SettingsError, load_settings

pytestmark = pytest.mark.skipif(not allocator.available(), reason="glibc only")

_MALLINFO = """
import ctypes, re, threading
from proxy import allocator

class MallInfo2(ctypes.Structure):
    _fields_ = [(n, ctypes.c_size_t) for n in (
        "arena", "ordblks", "smblks", "hblks", "hblkhd", "usmblks", "fsmblks", "uordblks", "fordblks", "keepcost")]

libc = ctypes.CDLL("libc.so.6")
libc.mallinfo2.restype = MallInfo2
libc.malloc.restype = ctypes.c_void_p
libc.malloc.argtypes = (ctypes.c_size_t,)
libc.free.argtypes = (ctypes.c_void_p,)

def mmapped_blocks():
    return libc.mallinfo2().hblks

def heaps():
    buf, size = ctypes.c_char_p(), ctypes.c_size_t()
    libc.open_memstream.restype = ctypes.c_void_p
    stream = libc.open_memstream(ctypes.byref(buf), ctypes.byref(size))
    libc.malloc_info(0, ctypes.c_void_p(stream))
    libc.fclose(ctypes.c_void_p(stream))
    return len(re.findall(r'<heap nr="', ctypes.string_at(buf, size.value).decode()))
"""


def _run(script: str) -> str:
    """Run `script` after the helpers above in a fresh interpreter; its stdout, stripped."""
    code = _MALLINFO + textwrap.dedent(script)
    done = subprocess.run([sys.executable, "-c", code], capture_output=True, text=True, timeout=60, check=True)
    return done.stdout.strip()


_THREADS = """
applied = allocator.configure({arena_max}, 0)
ready = threading.Barrier(7)
def work():
    block = libc.malloc(4096)  # this thread's first malloc: glibc gives it an arena
    ready.wait()
    ready.wait()
    libc.free(block)
threads = [threading.Thread(target=work) for _ in range(6)]
for t in threads:
    t.start()
ready.wait()  # every thread holds its block
print(sorted(applied.items()), heaps())
ready.wait()
for t in threads:
    t.join()
"""


def test_arena_max_bounds_the_arenas_threads_make() -> None:
    assert _run(_THREADS.format(arena_max=2)) == "[('M_ARENA_MAX', 2)] 2"
    # glibc's default: each of the six threads makes its own arena beside the main one
    assert _run(_THREADS.format(arena_max=0)) == "[] 7"


_THRESHOLD = """
applied = allocator.configure(0, {threshold})
before = mmapped_blocks()
large = libc.malloc(2 * 1024 * 1024)
after_large = mmapped_blocks()
body = libc.malloc(600_000)
print(sorted(applied.items()), after_large - before, mmapped_blocks() - after_large)
"""


def test_mmap_threshold_decides_which_blocks_get_their_own_mapping() -> None:
    # fixed at 1 MiB: a 2 MiB block is mapped, a 600 KB body comes from the heap
    assert _run(_THRESHOLD.format(threshold=1024 * 1024)) == "[('M_MMAP_THRESHOLD', 1048576)] 1 0"
    # glibc's starting threshold (128 KiB): both are mapped
    assert _run(_THRESHOLD.format(threshold=0)) == "[] 1 1"


def test_trim_returns_free_heap_pages() -> None:
    out = _run(
        """
        blocks = [libc.malloc(100_000) for _ in range(400)]  # 40 MB from the heap (below the threshold)
        for i, block in enumerate(blocks):
            ctypes.memset(block, 1, 100_000)  # resident
        for i, block in enumerate(blocks):
            if i % 50:
                libc.free(block)  # holes between the blocks kept: no trim of the top can return them
        before = allocator.resident_bytes()
        trimmed = allocator.trim()
        print(trimmed, (before - allocator.resident_bytes()) // (1024 * 1024) >= 30)
        """
    )
    assert out == "True True"


async def test_trimmer_trims_while_served_and_once_after() -> None:
    served = [0]
    trimmer = allocator.Trimmer(1.0, lambda: served[0])
    ticks = [await trimmer.tick()]  # nothing served yet: no trim
    served[0] = 3
    ticks.append(await trimmer.tick())  # requests since the last tick
    served[0] = 5
    ticks.append(await trimmer.tick())
    ticks.append(await trimmer.tick())  # quiet: the one trim after the traffic
    ticks.append(await trimmer.tick())  # still quiet: nothing more
    assert (ticks, trimmer.trims) == ([False, True, True, True, False], 3)


def test_is_due() -> None:
    assert allocator.is_due(4, 3, True) is True
    assert allocator.is_due(4, 4, False) is True
    assert allocator.is_due(4, 4, True) is False


async def test_a_zero_interval_starts_no_task() -> None:
    trimmer = allocator.Trimmer(0.0, lambda: 1)
    async with trimmer.running():
        assert (await trimmer.tick(), trimmer.trims) == (True, 1)  # tick() still works by hand


def test_settings_defaults_and_bounds() -> None:
    settings = Settings()
    assert (settings.malloc_arena_max, settings.malloc_mmap_threshold, settings.malloc_trim_interval) == (2, 0, 1.0)
    env = {"PROMPTCACHE_MALLOC_ARENA_MAX": "0", "PROMPTCACHE_MALLOC_TRIM_INTERVAL": "0"}
    loaded = load_settings(environ=env)
    assert (loaded.malloc_arena_max, loaded.malloc_trim_interval) == (0, 0.0)
    with pytest.raises(SettingsError, match="malloc_mmap_threshold"):
        load_settings(environ={"PROMPTCACHE_MALLOC_MMAP_THRESHOLD": str(64 * 1024 * 1024)})


def test_not_on_glibc_nothing_is_applied(monkeypatch: pytest.MonkeyPatch) -> None:
    monkeypatch.setattr(allocator, "_LIBC", None)  # the platform, not our code: musl or macOS
    assert (allocator.available(), allocator.configure(2, 1 << 20), allocator.trim()) == (False, {}, False)

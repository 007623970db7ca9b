"""Make `docs/forensic-map.png`: the forensic map of a real Claude Code session.

Claude Code (installed by the client suite, `tests/clients/`) runs its recipe headless and
offline against promptcache in front of the simulator; the session's page is fetched from the
proxy's `/ui/sessions/{id}` (one self-contained file), rendered by headless chromium
(`--screenshot`) and stored as a small palette PNG.

    PROMPTCACHE_CLIENTS_DIR=/work/main/.clients .venv/bin/python docs/forensic_map_screenshot.py
"""

from __future__ import annotations

import re
import subprocess
import sys
import tempfile
import urllib.request
from pathlib import Path

from PIL import Image, ImageChops

ROOT = Path(__file__).resolve().parents[1]
sys.path.insert(0, str(ROOT))

from tests.clients.harness import Stack  # noqa: E402
from tests.clients.recipes import RECIPES  # noqa: E402
from tests.ui.cdp import find_chromium  # noqa: E402

OUT = ROOT / "docs" / "forensic-map.png"
WIDTH, HEIGHT = 1280, 1180


def main() -> int:
    chromium = find_chromium()
    if chromium is None:
        print("chromium not found (scripts/install installs it)", file=sys.stderr)
        return 1
    recipe = RECIPES["claude-code"]
    with tempfile.TemporaryDirectory(prefix="pc-shot-") as tmp:
        work = Path(tmp)
        from tests.clients.harness import ensure_installed

        ensure_installed(recipe.install)
        with Stack(record=work / "trace.jsonl") as stack:
            turns, ids, problems = recipe.drive(recipe, stack, work)
            if problems:
                print("\n".join(problems), file=sys.stderr)
                return 1
            session = ids[0]
            with urllib.request.urlopen(f"{stack.proxy_url}/ui/?token={stack.ui_token}") as r:
                listing = r.read().decode()
            # The main session is the one with the most requests (the recipe adds a one-turn session).
            links = re.findall(r'href="(sessions/[^"]+)".*?</td><td>(\d+)</td>', listing)
            link = max(links, key=lambda item: int(item[1]))[0]
            with urllib.request.urlopen(f"{stack.proxy_url}/ui/{link.replace('&amp;', '&')}") as r:
                page = r.read()
        html = work / "map.html"
        html.write_bytes(page)
        shot = work / "shot.png"
        subprocess.run(
            [
                chromium,
                "--headless=new",
                "--no-sandbox",
                "--disable-gpu",
                "--hide-scrollbars",
                "--force-device-scale-factor=1",
                f"--window-size={WIDTH},{HEIGHT}",
                f"--screenshot={shot}",
                html.as_uri(),
            ],
            check=True,
            capture_output=True,
            timeout=120,
        )
        image = Image.open(shot).convert("RGB")
        # Crop the empty page below the content (a margin of 16 px kept).
        background = Image.new("RGB", image.size, image.getpixel((0, 0)))
        box = ImageChops.difference(image, background).getbbox()
        if box is not None:
            image = image.crop((0, 0, image.width, min(image.height, box[3] + 16)))
        image.quantize(colors=256, method=Image.Quantize.FASTOCTREE, dither=Image.Dither.NONE).save(OUT, optimize=True)
    print(f"{OUT} ({OUT.stat().st_size:,} bytes) from Claude Code session {session}")
    return 0


if __name__ == "__main__":
    sys.exit(main())

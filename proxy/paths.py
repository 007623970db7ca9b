"""Where the packaged `rules/` folder is.

In a source checkout or an editable install it is `rules/` next to the `proxy/` package; a
wheel installs the same files as data under `<prefix>/share/promptcache/rules` (see
`[tool.setuptools.data-files]` in pyproject.toml).
"""

from __future__ import annotations

import sys
from pathlib import Path


def packaged_rules_dir() -> Path:
    """The packaged rules folder (the source checkout's first, then the installed data files)."""
    source = Path(__file__).resolve().parent.parent / "rules"
    if source.is_dir():
        return source
    for prefix in (sys.prefix, sys.base_prefix):
        installed = Path(prefix) / "share" / "promptcache" / "rules"
        if installed.is_dir():
            return installed
    return source

"""Where the packaged data folders (`rules/`, `workloads/`) are.

In a source checkout or an editable install each is the folder of that name next to the `proxy/`
package; a wheel installs the same files as data under `<prefix>/share/promptcache/<name>` (see
`[tool.setuptools.data-files]` in pyproject.toml), where `<prefix>` is the environment's
(`sys.prefix`, a virtualenv or the system) or the user's (`pip install --user`: `site.USER_BASE`).
"""

from __future__ import annotations

import site
import sys
from pathlib import Path

SOURCE_ROOT = Path(__file__).resolve().parent.parent
"""The folder holding `proxy/` (the repository root in a source checkout)."""


def packaged_dir(name: str) -> Path:
    """The packaged data folder `name`: the source checkout's first, then the installed data files.

    Returns the source checkout's path when no candidate exists, so an error names a real place.
    """
    source = SOURCE_ROOT / name
    if source.is_dir():
        return source
    prefixes = (sys.prefix, sys.base_prefix, site.USER_BASE or "")
    for prefix in prefixes:
        installed = Path(prefix) / "share" / "promptcache" / name
        if prefix and installed.is_dir():
            return installed
    return source


def packaged_rules_dir() -> Path:
    """The packaged `rules/` folder (rule files, prices, the simulator's model table)."""
    return packaged_dir("rules")


def packaged_workloads_dir() -> Path:
    """The packaged `workloads/` folder (the committed traces of the suite, `clients/` recordings)."""
    return packaged_dir("workloads")

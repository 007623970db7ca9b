"""`python -m proxy.sim`: the same as `promptcache simulate`."""

from __future__ import annotations

import sys

from proxy.sim.cli import main

sys.exit(main())

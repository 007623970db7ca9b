"""`python -m proxy` is `promptcache`."""

import sys

from proxy.cli import main

sys.exit(main())

"""`python -m multicall` behaves like the `cnibox` binary."""

import sys

from multicall.dispatch import main

sys.exit(main())

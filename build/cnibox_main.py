"""Nuitka's main file: the compiled binary is the dispatcher, nothing else."""

import sys

from multicall.dispatch import main

sys.exit(main())

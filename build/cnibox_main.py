"""Nuitka's main file: the compiled binary is the dispatcher, nothing else."""

import os

import multicall
from multicall import dataclass_cache

# Before the first dataclass is made: the build stores their compiled methods beside the code.
dataclass_cache.install(
    os.path.join(os.path.dirname(os.path.dirname(multicall.__file__)), "dataclasses.marshal")
)

from multicall.dispatch import exit_now, main  # noqa: E402 - after the cache, on purpose

exit_now(main())

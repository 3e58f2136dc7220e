"""Nuitka's main file: the compiled binary is the dispatcher, nothing else."""

from multicall.dispatch import exit_now, main

exit_now(main())

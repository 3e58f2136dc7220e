"""`python -m multicall` behaves like the `cnibox` binary."""

from multicall.dispatch import exit_now, main

exit_now(main())

"""Pure functions over values: no os, subprocess, socket, ctypes or multicall.effects here
(tests/pure/test_layering.py enforces it)."""

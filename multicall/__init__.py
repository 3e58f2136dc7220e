"""cnibox: a busybox-style multi-call executable for Linkerd's CNI on minimal hosts."""

__version__ = "0.1.0"

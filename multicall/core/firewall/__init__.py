"""Linkerd's PROXY_INIT rules as data, and the iptables rule format they are written in."""

"""Thin adapters over the kernel, the filesystem and the network.

The only package allowed to import os-level effects (ctypes, subprocess, socket); everything
above it works on values from `multicall.core`.
"""

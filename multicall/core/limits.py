"""Every bound cnibox puts on what it reads, in one place (docs/hardening.md lists them).

Rules of this module:
1. Each limit has a generous margin over real use (the figure it is measured against is
   in its comment), so only hostile or broken input ever reaches one.
2. An input over its limit is refused with an error naming the input and the limit
   (`describe_size`); nothing is read beyond `limit + 1` bytes to find that out.
"""

from __future__ import annotations

import re

KIB = 1024
MIB = 1024 * KIB
GIB = 1024 * MIB

# The network config the runtime writes on the plugin's stdin: a few KiB in practice (a
# conflist entry plus prevResult and runtimeConfig); 1 MiB is also the largest ConfigMap or
# object the API server stores, so no config delivered through Kubernetes comes close.
NETWORK_CONFIG = 1 * MIB
# A kubeconfig: the installer's is under 4 KiB; a user's multi-cluster one with embedded
# certificates some hundred KiB.
KUBECONFIG = 4 * MIB
# certificate-authority: a CA bundle (a distribution's whole bundle is about 200 KiB).
CA_FILE = 4 * MIB
# A bearer token file (a projected service account token is about 1 KiB).
TOKEN_FILE = 64 * KIB
# A Kubernetes object given to iptables-verify as a file (--pod, --namespace-object,
# --service) or a network config / conflist (--config): etcd stores at most 1.5 MiB.
OBJECT_FILE = 4 * MIB
# iptables-verify --input is streamed: only one line is in memory at a time. iptables-
# restore reads lines into a 1 KiB..64 KiB buffer; a line longer than this is not save text.
SAVE_LINE = 64 * KIB
# The whole save text: a node with 10 000 Services prints about 50 MiB.
SAVE_TOTAL = 1 * GIB
# What the plugin GETs from the API (a pod, a namespace, a service): etcd's 1.5 MiB object
# limit, with margin. The response head: Go's http.Transport allows 10 MiB by default,
# kube-apiserver sends under 1 KiB.
API_OBJECT = 4 * MIB
API_HEAD = 1 * MIB
# (JSON nesting is bounded as Go bounds it, 10000 levels: core/go/encoding_json/scanner.py.)
# JSON values in one document (`json_values`), so memory is bounded by what an input holds,
# not only its size: parsed, each value is a Python object of 50-200 bytes, and 4 MiB of
# `{},` (1.4 million empty objects) peaked at 141 MiB (issue 30 item 9). An API object or
# watch event: a 1.5 MiB pod at 12 bytes a value (managedFields' `"f:x":{}`) holds 130,000.
# A network config or CNI config file: a few hundred; a prevResult of 100 interfaces and
# 1,000 routes some 5,000.
API_JSON_VALUES = 250_000
CONFIG_JSON_VALUES = 50_000
# install-cni: a CNI config in net.d, the network config, the service account token and CA,
# the kubeconfig (a few KiB each); the undo journal holds the original bytes of every
# patched config; a pid file or a /proc entry of the process it names.
INSTALLER_FILE = 1 * MIB
UNDO_JOURNAL = 16 * MIB
PID_FILE = 64 * KIB
# The Kubernetes API deadline of one invocation (CNIBOX_KUBE_TIMEOUT, seconds): the default,
# and the largest value taken; larger values are clamped (a value that cannot be a number
# of seconds is refused).
KUBE_TIMEOUT_DEFAULT = 5.0
KUBE_TIMEOUT_MAX = 600.0


def describe_size(size: int) -> str:
    """A limit as people write it: `1 MiB`, `64 KiB`, `1 GiB`, else bytes."""
    for unit, name in ((GIB, "GiB"), (MIB, "MiB"), (KIB, "KiB")):
        if size >= unit and size % unit == 0:
            return f"{size // unit} {name}"
    return f"{size} bytes"


# A JSON string, escapes included (the unrolled form: no backtracking per character).
_JSON_STRING = re.compile(rb'"[^"\\]*(?:\\.[^"\\]*)*"', re.DOTALL)


def json_values(data: bytes, limit: int | None = None) -> int:
    """How many values (and keys) parsing `data` as JSON makes, at most: outside strings
    every value but a container's first follows a comma, and a container's first follows its
    bracket. Counted in C over the bytes; only when that exceeds `limit` are the commas and
    brackets inside strings found and taken off (one match at a time: a million tiny strings
    cost no more memory than one), stopping once the count is within `limit`."""
    count = data.count(b",") + data.count(b"[") + data.count(b"{") + 1
    if limit is None or count > limit:
        for match in _JSON_STRING.finditer(data):
            text = match.group()
            if len(text) > 2:
                count -= text.count(b",") + text.count(b"[") + text.count(b"{")
                if limit is not None and count <= limit:
                    break
    return count


def too_many_json_values(data: bytes, limit: int) -> str | None:
    """The refusal's text when `data` holds more than `limit` JSON values, else None."""
    if (len(data) + 3) // 2 <= limit:  # a value and its comma take two bytes or more
        return None
    if json_values(data, limit) <= limit:
        return None
    return f"it holds more than {limit} JSON values, the limit for it"

"""The agent's node name: --node-name, else $NODE_NAME (the chart's downward API), else the
name the kubelet registers by default.

Rules of this module:
1. The default is the kubelet's when it has no --hostname-override: the kernel hostname,
   trimmed and lowercased (Kubernetes' node GetHostname). A Talos extension service has no
   downward API, so this is how it knows its node; a kubelet with --hostname-override (or a
   cloud provider's name) differs, and then the agent must be told with --node-name.
2. A wrong name is never a wrong answer: the pod cache then holds no pods (its field selector
   matches none), and an ADD the cache cannot answer reads the API; the cache answers only for
   the pod UID the runtime names (docs/pod-cache.md).
"""

from __future__ import annotations

from collections.abc import Mapping


def node_name(flag: str, env: Mapping[str, str], hostname: str) -> str:
    """This node's name, "" when none can be told (an empty hostname)."""
    return flag or env.get("NODE_NAME", "") or hostname.strip().lower()

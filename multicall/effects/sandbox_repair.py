"""`--repair-in-place`: program a pod's redirect in its running sandbox, as the plugin's ADD
would have, instead of deleting the pod (what Istio's repair controller does by default).

How the netns is found (core/sandbox.py): the runtime's libcni result cache names, for each
sandbox, the pod (CNI_ARGS), the network and the sandbox netns path; the entry must agree
with the pod's namespace, name, UID and IP. Before anything is written the netns is entered
and must hold one of the pod's IPs, and it must not be this process's own netns.

What is programmed: the linkerd-cni entry of the node's current network list of that name
(the entry that was missing when the pod started; if it is still missing the chain is still
incomplete and nothing is done), with the plugin's own API reads (pod, namespace, service)
and annotation overrides, through the plugin's firewall engine; then CHECK's comparison
must find exactly the expected rules. Any refusal is an `Outcome` with the reason: the
controller then deletes the pod, as upstream does.

Privileges (docs/repair-controller.md): read the node's /var/lib/cni and CNI config dir, open
the netns files under /var/run/netns (CAP_SYS_ADMIN to setns into them), program nat
(CAP_NET_ADMIN, and CAP_NET_RAW for `legacy`).
"""

from __future__ import annotations

import os
from collections.abc import Callable, Mapping
from dataclasses import dataclass
from typing import TYPE_CHECKING

from multicall.core import sandbox
from multicall.core.repair import pod_ref
from multicall.errors import CniboxError

if TYPE_CHECKING:
    from multicall.core.kubeconfig import KubeConfig
    from multicall.core.repair_cli import Options
    from multicall.effects.kube import PodInputs

Log = Callable[[str], None]
MAX_CONFIG_FILE = 1024 * 1024
API_TIMEOUT = 5.0


@dataclass(frozen=True, slots=True)
class Outcome:
    repaired: bool
    reason: str = ""
    netns: str = ""


class Refused(Exception):
    """Why a pod is not repaired in place (it will be deleted instead)."""


class Repairer:
    def __init__(self, options: Options, config: KubeConfig, log: Log) -> None:
        self.net_dir = options.cni_net_dir
        self.results_dir = os.path.join(options.cni_cache_dir, "results")
        self.host_root = options.host_root.rstrip("/")
        self.config = config
        self.log = log

    def repair(self, pod: Mapping[str, object]) -> Outcome:
        try:
            netns = self._repair(pod)
        except Refused as exc:
            return Outcome(False, str(exc))
        except CniboxError as exc:
            return Outcome(False, exc.message)
        return Outcome(True, netns=netns)

    def _repair(self, pod: Mapping[str, object]) -> str:
        from multicall.core.cni_config import base_options, mode_of, parse_netconf
        from multicall.core.k8s import parse_pod
        from multicall.core.pod_policy import decide, effective_options
        from multicall.effects.firewall import apply_proxy_init, differences

        ref = pod_ref(pod)
        spec = pod.get("spec")
        if isinstance(spec, Mapping) and spec.get("hostNetwork") is True:
            raise Refused("the pod uses the host's network namespace")
        if not decide(parse_pod(pod)).meshed:
            raise Refused("the pod gets no redirect from linkerd-cni")
        ips = sandbox.pod_ips(pod)
        if not ips:
            raise Refused("the pod has no IP yet")
        entry = sandbox.choose_sandbox(self._cache_entries(ref.namespace, ref.name, ref.uid, ips))
        if isinstance(entry, str):
            raise Refused(entry)
        netns = self._host_path(entry.netns)
        self._check_netns(netns, ips)
        plugin = self._plugin_config(entry.network)
        conf = parse_netconf(plugin)
        if conf.simulate:
            raise Refused("the linkerd-cni entry is in simulate mode")
        inputs = self._pod_inputs(ref.namespace, ref.name)
        if inputs.pod.name != ref.name or not decide(inputs.pod).meshed:
            raise Refused("the pod changed while it was being repaired")
        options = effective_options(
            base_options(conf), inputs.pod, inputs.namespace_annotations, inputs.service
        )
        mode = mode_of(conf)
        apply_proxy_init(netns, options, mode=mode, ipv6=conf.ipv6, log=self.log)
        problems = differences(netns, options, mode=mode, ipv6=conf.ipv6, log=self.log)
        if problems:
            raise Refused("the programmed rules did not verify: " + "; ".join(problems))
        return netns

    def _cache_entries(
        self, namespace: str, name: str, uid: str, ips: tuple[str, ...]
    ) -> list[sandbox.CacheEntry]:
        try:
            names = sorted(os.listdir(self.results_dir))
        except OSError as exc:
            raise Refused(
                f"cannot read the CNI result cache {self.results_dir}: {exc.strerror}"
            ) from None
        found = []
        for filename in names:
            data = _read_small(os.path.join(self.results_dir, filename))
            entry = sandbox.parse_cache_entry(data) if data is not None else None
            if entry is not None and sandbox.entry_matches(entry, namespace, name, uid, ips):
                found.append(entry)
        return found

    def _host_path(self, path: str) -> str:
        """A netns path as the runtime wrote it, seen through the node's root mount."""
        if not path.startswith("/") or "/../" in path + "/" or "\x00" in path:
            raise Refused(f"the CNI result cache names an unusable netns path {path!r}")
        candidates = [self.host_root + path]
        if path.startswith("/run/"):
            candidates.append(self.host_root + "/var" + path)  # /var/run -> /run on the node
        for candidate in candidates:
            if os.path.exists(candidate):
                return candidate
        raise Refused(f"the sandbox network namespace {path} no longer exists")

    def _check_netns(self, netns: str, ips: tuple[str, ...]) -> None:
        from multicall.effects.ns import entered_netns, is_own_netns

        if is_own_netns(netns):
            raise Refused(f"{netns} is the controller's own network namespace")
        with entered_netns(netns):
            owned = sandbox.local_addresses(
                _read_text("/proc/thread-self/net/fib_trie"),
                _read_text("/proc/thread-self/net/if_inet6"),
            )
        if not owned & set(ips):
            raise Refused(f"{netns} does not hold the pod's IP {', '.join(ips)}")

    def _plugin_config(self, network: str) -> bytes:
        from multicall.core.conflist import is_cni_config_name

        try:
            names = sorted(os.listdir(self.net_dir))
        except OSError as exc:
            raise Refused(f"cannot read {self.net_dir}: {exc.strerror}") from None
        for filename in names:
            if not is_cni_config_name(filename):
                continue
            data = _read_small(os.path.join(self.net_dir, filename))
            plugin = sandbox.linkerd_plugin_config(data, network) if data is not None else None
            if plugin is not None:
                return plugin
        raise Refused(
            f"no network list named {network!r} in {self.net_dir} has a linkerd-cni "
            "entry yet (the CNI chain is still incomplete)"
        )

    def _pod_inputs(self, namespace: str, name: str) -> PodInputs:
        from multicall.effects.kube import KubeClient, read_pod_inputs

        client = KubeClient(self.config, timeout=API_TIMEOUT)
        try:
            return read_pod_inputs(client, namespace, name)
        finally:
            client.close()


def _read_small(path: str) -> bytes | None:
    try:
        with open(path, "rb") as f:
            data = f.read(MAX_CONFIG_FILE + 1)
    except OSError:
        return None
    return data if len(data) <= MAX_CONFIG_FILE else None


def _read_text(path: str) -> str:
    try:
        with open(path, encoding="ascii", errors="replace") as f:
            return f.read(4 * MAX_CONFIG_FILE)
    except OSError:
        return ""

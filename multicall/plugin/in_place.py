"""Repair in place: program a pod's redirect in its running sandbox by running the plugin's
own ADD there, instead of deleting the pod (what Istio's repair controller does by
default). Two services use it, so it lives here: the repair controller's
`--repair-in-place` (repair/controller.py, by pod) and the node agent's keeper
(agent/keeper.py, by a recorded sandbox: `repair_sandbox`).

Rules of this module:
1. The rules go in through the seam (`run.run_plugin`, command ADD) exactly as the runtime's
   call would have put them: the node's current linkerd-cni entry as stdin, the CNI_* values
   the runtime's result cache holds for the sandbox, the sandbox netns as an fd opened once
   and checked to hold the pod's IP (effects/pod_sandbox.py). There is no second copy of
   ADD: the same config decoding, API reads, annotation overrides and firewall engine run.
2. Two ports differ from the binary's: the `Kube` port is the controller's own configuration
   (`ControllerKube`), not the kubeconfig path the entry names (a node path, written for the
   plugin); the firewall takes the node's xtables lock under the host root
   (`node_xtables_lock`), as the node agent does.
3. What ADD programmed (as `plugin/recording.py` recorded it) is then compared with the
   live tables by CHECK's comparison
   (`commands.drifted_families`); an ADD that programmed nothing (the pod is no longer
   meshed, or the entry is in simulate mode) is a refusal.
4. Any refusal is an `Outcome` with its reason; the controller then deletes the pod.
5. Threads: the firewall enters the netns on the calling thread only; the legacy backend
   forks one child per table operation from that thread, which keeps no lock another thread
   may hold (tests/netns/test_repair_controller.py runs both backends in the controller).
"""

from __future__ import annotations

import io
import json
from collections.abc import Mapping
from dataclasses import dataclass
from typing import TYPE_CHECKING

from multicall.effects.pod_sandbox import Refused, SandboxFinder, opened_sandbox
from multicall.errors import CniboxError

if TYPE_CHECKING:
    from multicall.core.kube.kubeconfig import KubeConfig
    from multicall.core.logs import MessageLog
    from multicall.effects.firewall.locks import XtablesLock
    from multicall.effects.pod_sandbox import Sandbox
    from multicall.plugin.ports import Firewall, Kube, PodApi
    from multicall.plugin.recording import Programmed

API_TIMEOUT = 5.0  # each GET of the ADD, as the plugin's default


@dataclass(frozen=True, slots=True)
class Outcome:
    """Whether a pod was repaired in place, and if not why."""

    repaired: bool
    reason: str = ""
    netns: str = ""


class ControllerKube:
    """The plugin's `Kube` port over the controller's own API configuration."""

    def __init__(self, config: KubeConfig, timeout: float = API_TIMEOUT) -> None:
        self.config = config
        self.timeout = timeout

    def check_kubeconfig(self, path: str) -> None:
        """STATUS's question; ADD does not ask it."""

    def connect(self, kubeconfig: str, env: Mapping[str, str]) -> PodApi:
        from multicall.effects.kube.client import KubeClient

        return KubeClient(self.config, timeout=self.timeout)


def node_xtables_lock(host_root: str) -> XtablesLock | None:
    """The node's xtables lock as this pod sees it (`<host root>/run/xtables.lock`, a hostPath
    mount), so that the legacy backend excludes kube-proxy and iptables on the node
    (effects/firewall/locks.py rule 4); None when the node's / is ours (as iptables finds it)."""
    from multicall.effects.firewall.locks import XT_LOCK_NAME, XtablesLock

    root = host_root.rstrip("/")
    return XtablesLock(path=root + XT_LOCK_NAME) if root else None


class Repairer:
    def __init__(
        self, finder: SandboxFinder, kube: Kube, log: MessageLog, firewall: Firewall
    ) -> None:
        self.finder = finder
        self.kube = kube
        self.log = log
        self.firewall = firewall  # the real engine (plugin/ports.RealFirewall)

    def repair(self, pod: Mapping[str, object]) -> Outcome:
        try:
            netns = self._repair(pod)
        except Refused as exc:
            return Outcome(False, str(exc))
        except CniboxError as exc:
            return Outcome(False, exc.message)
        return Outcome(True, netns=netns)

    def _repair(self, pod: Mapping[str, object]) -> str:
        from multicall.core.kube.objects import parse_pod
        from multicall.core.kube.pod_policy import decide
        from multicall.core.repair.policy import pod_ref
        from multicall.core.repair.sandbox import pod_ips

        ref = pod_ref(pod)
        spec = pod.get("spec")
        if isinstance(spec, Mapping) and spec.get("hostNetwork") is True:
            raise Refused("the pod uses the host's network namespace")
        if not decide(parse_pod(pod)).meshed:
            raise Refused("the pod gets no redirect from linkerd-cni")
        ips = pod_ips(pod)
        if not ips:
            raise Refused("the pod has no IP yet")
        found = self.finder.find(ref.namespace, ref.name, ref.uid, ips)
        self.repair_sandbox(found, ips)
        return found.netns

    def repair_sandbox(self, found: Sandbox, ips: tuple[str, ...]) -> Programmed:
        """ADD in the sandbox `found` (its netns checked to hold one of `ips`), then CHECK's
        comparison of what it programmed; what was programmed, or Refused."""
        from multicall.plugin.commands import drifted_families, readable

        with opened_sandbox(found.netns, ips) as fd:
            done = self._add(found, fd)
            problems = readable(
                drifted_families(
                    self.firewall,
                    done.netns,
                    done.options,
                    mode=done.mode,
                    families=done.families,
                    log=self.log,
                )
            )
        if problems:
            raise Refused("the programmed rules did not verify: " + "; ".join(problems))
        return done

    def _add(self, found: Sandbox, netns_fd: int) -> Programmed:
        """The plugin's ADD in the sandbox; what it programmed, or Refused with its error."""
        from multicall.core.repair.sandbox import plugin_env
        from multicall.plugin.ports import PluginDeps
        from multicall.plugin.recording import RecordingFirewall
        from multicall.plugin.run import PluginRequest, run_plugin

        firewall = RecordingFirewall(self.firewall)
        plugin_log = io.BytesIO()
        result = run_plugin(
            PluginRequest(
                env=plugin_env(found.entry, found.netns, "ADD"),
                stdin=found.plugin_config,
                stderr=plugin_log,
                netns_fd=netns_fd,
            ),
            PluginDeps(self.kube, firewall),
        )
        for line in plugin_log.getvalue().decode("utf-8", "replace").splitlines():
            self.log(f"linkerd-cni: {line}")
        if result.exit_code != 0:
            raise Refused(f"linkerd-cni's ADD failed: {_cni_error(result.stdout)}")
        if firewall.programmed is None:
            raise Refused(
                "linkerd-cni's ADD programmed nothing (the pod is no longer meshed, "
                "or the linkerd-cni entry is in simulate mode)"
            )
        return firewall.programmed


def _cni_error(stdout: bytes) -> str:
    """`msg: details` of the CNI error JSON the plugin printed."""
    try:
        doc = json.loads(stdout)
    except ValueError:
        doc = None
    if not isinstance(doc, dict):
        return stdout.decode("utf-8", "replace").strip()
    message, details = str(doc.get("msg", "")), str(doc.get("details", ""))
    return f"{message}: {details}" if details else message

"""A CRI v1 client for the suite: the calls a kubelet makes to start and end a pod sandbox,
over containerd's unix socket, with generated messages (tests/cri/proto) and a deadline on
every call. Errors stay grpc.RpcError: tests read their `details()` (the runtime's message,
which carries the CNI plugin's error text)."""

from __future__ import annotations

import json
from collections.abc import Mapping
from dataclasses import dataclass
from typing import Any

import grpc

from tests.cri.proto import api_pb2 as api
from tests.cri.proto import api_pb2_grpc as rpc

# What a RunPodSandbox may take here: pull nothing, one CNI chain, a 5 s API deadline inside.
CALL_TIMEOUT = 60.0
LOOPBACK_NETWORK = "cni-loopback"  # containerd's own network for `lo` (go-cni WithLoNetwork)


@dataclass(frozen=True)
class PodRef:
    """The identity a kubelet gives a sandbox (PodSandboxMetadata) plus the pod's labels and
    annotations, which kubelet copies into the sandbox config."""

    namespace: str
    name: str
    uid: str
    labels: Mapping[str, str]
    annotations: Mapping[str, str]

    @classmethod
    def of(cls, pod: Mapping[str, Any], uid: str) -> PodRef:
        meta = pod["metadata"]
        return cls(meta["namespace"], meta["name"], uid, dict(meta.get("labels") or {}),
                   dict(meta.get("annotations") or {}))  # fmt: skip


@dataclass(frozen=True)
class SandboxInfo:
    """What containerd reports about a sandbox (PodSandboxStatus, verbose)."""

    id: str
    ready: bool
    ip: str
    netns: str  # the pod's network namespace path, as containerd (and the plugin) sees it
    pid: int  # the pause process, in the machine's pid namespace


class CriClient:
    def __init__(self, socket: str) -> None:
        self.channel = grpc.insecure_channel(f"unix://{socket}")
        self.runtime = rpc.RuntimeServiceStub(self.channel)
        self.images = rpc.ImageServiceStub(self.channel)

    def close(self) -> None:
        self.channel.close()

    def version(self, timeout: float = CALL_TIMEOUT) -> api.VersionResponse:
        return self.runtime.Version(api.VersionRequest(version="v1"), timeout=timeout)

    def conditions(self) -> dict[str, tuple[bool, str]]:
        """RuntimeReady / NetworkReady → (status, message)."""
        status = self.runtime.Status(api.StatusRequest(), timeout=CALL_TIMEOUT).status
        return {c.type: (c.status, c.message) for c in status.conditions}

    def loaded_cni_config(self) -> list[dict[str, Any]]:
        """The network lists containerd's CNI plugin has loaded from conf_dir (Status verbose
        `cniconfig`), without the loopback network it always adds first."""
        info = self.runtime.Status(api.StatusRequest(verbose=True), timeout=CALL_TIMEOUT).info
        networks = json.loads(info.get("cniconfig", "{}")).get("Networks") or []
        loaded = [json.loads(net["Config"]["Source"]) for net in networks]
        return [conf for conf in loaded if conf.get("name") != LOOPBACK_NETWORK]

    def has_image(self, ref: str) -> bool:
        request = api.ImageStatusRequest(image=api.ImageSpec(image=ref))
        return self.images.ImageStatus(request, timeout=CALL_TIMEOUT).HasField("image")

    def run_pod_sandbox(self, pod: PodRef, cgroup_parent: str) -> str:
        """RunPodSandbox as kubelet sends it for a pod on the pod network; the sandbox id."""
        config = api.PodSandboxConfig(
            metadata=api.PodSandboxMetadata(
                name=pod.name, uid=pod.uid, namespace=pod.namespace, attempt=0
            ),
            hostname=pod.name,
            labels={
                **pod.labels,
                "io.kubernetes.pod.name": pod.name,
                "io.kubernetes.pod.namespace": pod.namespace,
                "io.kubernetes.pod.uid": pod.uid,
            },
            annotations=dict(pod.annotations),
            linux=api.LinuxPodSandboxConfig(
                cgroup_parent=cgroup_parent,
                security_context=api.LinuxSandboxSecurityContext(
                    namespace_options=api.NamespaceOption(
                        network=api.POD, pid=api.CONTAINER, ipc=api.POD
                    )
                ),
            ),
        )
        request = api.RunPodSandboxRequest(config=config)
        return self.runtime.RunPodSandbox(request, timeout=CALL_TIMEOUT).pod_sandbox_id

    def stop(self, sandbox_id: str) -> None:
        request = api.StopPodSandboxRequest(pod_sandbox_id=sandbox_id)
        self.runtime.StopPodSandbox(request, timeout=CALL_TIMEOUT)

    def remove(self, sandbox_id: str) -> None:
        request = api.RemovePodSandboxRequest(pod_sandbox_id=sandbox_id)
        self.runtime.RemovePodSandbox(request, timeout=CALL_TIMEOUT)

    def sandbox(self, sandbox_id: str) -> SandboxInfo:
        request = api.PodSandboxStatusRequest(pod_sandbox_id=sandbox_id, verbose=True)
        response = self.runtime.PodSandboxStatus(request, timeout=CALL_TIMEOUT)
        info = json.loads(response.info["info"])
        netns = next(
            (ns.get("path", "") for ns in info["runtimeSpec"]["linux"]["namespaces"]
             if ns["type"] == "network"), "",
        )  # fmt: skip
        status = response.status
        return SandboxInfo(status.id, status.state == api.SANDBOX_READY, status.network.ip,
                           netns, int(info.get("pid", 0)))  # fmt: skip

    def sandbox_ids(self) -> list[str]:
        response = self.runtime.ListPodSandbox(api.ListPodSandboxRequest(), timeout=CALL_TIMEOUT)
        return [item.id for item in response.items]

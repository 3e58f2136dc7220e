"""The gate's checks on this node, each a `CheckResult` (core/node_gate.py CHECKS order):
the plugin file is in place, the primary CNI config chains linkerd-cni (read back), the API
answers with the kubeconfig the plugin uses, the node agent accepts (when configured).

Each check is bounded: files are read with the installer's limits, the API call has the
gate's deadline, the agent's ACCEPT frame must come within AGENT_DEADLINE.
"""

from __future__ import annotations

import hashlib
import os
import socket
from collections.abc import Mapping
from dataclasses import dataclass

from multicall.core import agent_protocol
from multicall.core.installer import conflist
from multicall.core.installer.config import InstallerConfig
from multicall.core.kube import paths
from multicall.core.kube.kubeconfig import parse_kubeconfig
from multicall.core.limits import INSTALLER_FILE, KUBECONFIG
from multicall.core.node_gate import CheckResult
from multicall.effects import fs
from multicall.effects.kube.config import read_text_file
from multicall.effects.kube.stream import ClientOptions, Session, Token
from multicall.errors import CniboxError

PLUGIN_NAME = "linkerd-cni"
AGENT_DEADLINE = 2.0
MAX_CONFIGS = 256  # config files looked at in the net dir


@dataclass(frozen=True, slots=True)
class Chain:
    """The primary config as read back: its name, digest and linkerd entry (None: absent)."""

    name: str
    digest: str
    linkerd: Mapping[str, object] | None


def plugin_path(config: InstallerConfig) -> str:
    return os.path.join(config.host_bin_dir, PLUGIN_NAME)


def container_view(config: InstallerConfig, path: str) -> str:
    """The installed link's target as this container sees it: a link to a host path (the
    Talos extension's binary) is read under the mount prefix."""
    seen = 0
    while os.path.islink(path) and seen < 8:
        target = os.readlink(path)
        if os.path.isabs(target):
            path = os.path.join(config.mount_prefix or "/", target.lstrip("/"))
        else:
            path = os.path.join(os.path.dirname(path), target)
        seen += 1
    return path


def check_plugin(config: InstallerConfig) -> tuple[CheckResult, str]:
    """The installed `linkerd-cni`, resolved to a regular executable file (what to exec)."""
    link = plugin_path(config)
    if not os.path.lexists(link):
        return CheckResult("PluginInstalled", False, f"{link} does not exist"), ""
    target = container_view(config, link)
    try:
        st = os.stat(target)
    except OSError as exc:
        return CheckResult("PluginInstalled", False, f"{target}: {exc.strerror}"), ""
    if not os.path.isfile(target) or not st.st_mode & 0o111:
        return CheckResult("PluginInstalled", False, f"{target} is not an executable file"), ""
    return CheckResult("PluginInstalled", True), target


def primary_config_name(names: list[str]) -> str:
    """The file a runtime loads (libcni ConfFiles, sorted; the first one wins)."""
    candidates = sorted(n for n in names if conflist.is_cni_config_name(n))
    return candidates[0] if candidates else ""


def installed(config: InstallerConfig) -> CheckResult:
    """The plugin file and the chain read back: what install-cni's readiness is (its admin
    server's /readyz, `install-cni --ready`), without the API, agent and self-test."""
    plugin, _ = check_plugin(config)
    return plugin if not plugin.ok else read_chain(config)[0]


def read_chain(config: InstallerConfig) -> tuple[CheckResult, Chain | None]:
    net_dir = config.host_net_dir
    try:
        names = os.listdir(net_dir)[: MAX_CONFIGS * 8]
    except OSError as exc:
        return CheckResult("ChainConfigured", False, f"{net_dir}: {exc.strerror}"), None
    if config.conf_name:
        names = [n for n in names if n in (config.conf_name, config.conf_name + "list")]
    name = primary_config_name(names)
    if not name:
        return CheckResult("ChainConfigured", False, f"no CNI config in {net_dir}"), None
    path = os.path.join(net_dir, name)
    try:
        data = fs.read_file(path, INSTALLER_FILE, what="CNI config")
        document = conflist.parse_document(data or b"", "the primary CNI config")
    except CniboxError as exc:
        return CheckResult("ChainConfigured", False, f"{name}: {exc.message}"), None
    plugins = document.get("plugins")
    linkerd = next(
        (p for p in plugins if conflist.is_linkerd(p)) if isinstance(plugins, list) else iter(()),
        None,
    )
    chain = Chain(
        name,
        hashlib.sha256(data or b"").hexdigest(),
        linkerd if isinstance(linkerd, dict) else None,
    )
    if chain.linkerd is None:
        return CheckResult("ChainConfigured", False, f"{name} does not chain linkerd-cni"), chain
    return CheckResult("ChainConfigured", True), chain


def check_api(config: InstallerConfig, node: str, timeout: float) -> CheckResult:
    """A GET of this node with the kubeconfig the installer wrote for the plugin."""
    path = config.kubeconfig_path
    try:
        text = read_text_file(path, limit=KUBECONFIG, what="kubeconfig")
        kube = parse_kubeconfig(text)
        session = Session(kube, Token(kube), ClientOptions(headers_timeout=timeout))
        try:
            answer = session.request("GET", paths.node(node), timeout=timeout)
        finally:
            session.close()
    except CniboxError as exc:
        return CheckResult("APIReachable", False, exc.message)
    if answer.status != 200:
        return CheckResult("APIReachable", False, f"GET node {node}: HTTP {answer.status}")
    return CheckResult("APIReachable", True)


def check_agent(socket_path: str) -> CheckResult:
    """Send the agent a whole VERSION request (it reads a request whole before it admits it:
    agent/admission.py) and read its first frame: ACCEPT means it admits callers now (a
    draining or stopped agent closes or refuses). The request carries no descriptors, so
    the agent answers FALLBACK after the ACCEPT and changes nothing."""
    sock = socket.socket(socket.AF_UNIX, socket.SOCK_STREAM)
    sock.settimeout(AGENT_DEADLINE)
    request = agent_protocol.encode_request(
        agent_protocol.SOURCE_BUILD, ("linkerd-cni",), {"CNI_COMMAND": "VERSION"}, "/", b"", 0
    )
    try:
        sock.connect(socket_path)
        sock.sendall(request)
        head = b""
        while len(head) < agent_protocol.FRAME.size:
            chunk = sock.recv(agent_protocol.FRAME.size - len(head))
            if not chunk:
                return CheckResult("AgentServing", False, "the agent closed the connection")
            head += chunk
    except OSError as exc:
        return CheckResult("AgentServing", False, f"{socket_path}: {exc.strerror or exc}")
    finally:
        sock.close()
    kind, _length = agent_protocol.FRAME.unpack(head)
    if kind != agent_protocol.FRAME_ACCEPT:  # sent at once to an admitted caller
        return CheckResult("AgentServing", False, f"the agent answered frame type {kind}")
    return CheckResult("AgentServing", True)

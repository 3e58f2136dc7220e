"""`make demo`: what cnibox does on a node, step by step, on this machine, in throwaway
namespaces and a scratch directory, with what each step fakes said as it runs.

Run as root with `python -m tests.demo` (`make demo` builds dist/cnibox first and uses it).
1. the applet links; 2. the installer (`install-cni --once`) against a scratch host tree:
   the patched conflist and the kubeconfig it writes, then `--uninstall`; 3. a node netns
   with a bridge and a pod netns on it; 4-6. work in the pod through a symlink named
   `nsenter` pointing to cnibox (what a Talos node gets instead of util-linux), ending with
   Linkerd's own call `nsenter --net=<pod> -- iptables-nft-save -t nat`; 7. the real libcni
   runs bridge + host-local + cnibox as `linkerd-cni` for a meshed and a plain pod: the
   meshed pod's rules, CNI CHECK, `iptables-verify --netns`, TCP connections through the
   redirect (4143 in, 4140 out, the proxy uid exempt), the plugin's log lines, and a failed
   ADD as the node's log shows it. Then the next steps for a real cluster.
Everything is removed at the end, also on failure.

Extending it: write a `def step_x(demo: Demo) -> None` that prints what it shows and add it
to `STEPS` in the order it should run. `Demo` carries the shared state; add fields to it.
Which cnibox runs: $CNIBOX if set, else dist/cnibox if built, else the venv's console script.
"""

from __future__ import annotations

import json
import os
import subprocess
import sys
import tempfile
from collections.abc import Callable
from dataclasses import dataclass, field
from pathlib import Path

from tests.support.rig import Netns, Pod, Rig

BRIDGE = "cni0"
REPO_ROOT = Path(__file__).resolve().parent.parent


@dataclass
class Demo:
    rig: Rig
    workdir: Path
    cnibox: Path
    links: Path = field(init=False)
    node_pod: Pod | None = None

    def __post_init__(self) -> None:
        self.links = self.workdir / "bin"
        self.links.mkdir()

    @property
    def pod(self) -> Pod:
        assert self.node_pod is not None, "step_pod_network must run first"
        return self.node_pod

    def nsenter(self, *args: str) -> str:
        """Run the `nsenter` link (cnibox) and return its stdout; fail loudly otherwise."""
        argv = [str(self.links / "nsenter"), *args]
        proc = subprocess.run(argv, capture_output=True, text=True, timeout=60, check=False)
        if proc.returncode != 0:
            raise SystemExit(f"demo: {' '.join(argv)} exited {proc.returncode}: {proc.stderr}")
        return proc.stdout


def find_cnibox() -> Path:
    for candidate in (os.environ.get("CNIBOX"), REPO_ROOT / "dist" / "cnibox"):
        if candidate and Path(candidate).is_file():
            return Path(candidate)
    return Path(sys.executable).parent / "cnibox"


def say(title: str, body: str = "") -> None:
    print(f"\n==> {title}")
    if body:
        print("\n".join(f"    {line}" for line in body.rstrip("\n").splitlines()))


def explain(text: str) -> None:
    """What a step shows, and what it fakes that a real node would provide."""
    import textwrap

    print("\n" + textwrap.fill(text, width=96, initial_indent="  # ", subsequent_indent="  # "))


def shorten(text: str, width: int = 92) -> str:
    """Long lines (certificate data, tokens) cut for reading: the demo shows shapes."""
    return "\n".join(
        line if len(line) <= width else line[: width - 1] + "…" for line in text.splitlines()
    )


def step_links(demo: Demo) -> None:
    """Install cnibox's applet links, as the node installer will on a Talos host."""
    explain(
        "Step 1. One executable, many names: cnibox runs the applet named by the name it is "
        "called as. The installer links linkerd-cni (and, if asked, nsenter) to it on a node."
    )
    proc = subprocess.run(
        [str(demo.cnibox), "--install", "-s", str(demo.links)],
        capture_output=True,
        text=True,
        check=True,
    )
    say(f"cnibox --install -s {demo.links}  (cnibox = {demo.cnibox})", proc.stdout)


def step_installer(demo: Demo) -> None:
    """`install-cni --once` against a scratch host tree, then `--uninstall`."""
    import yaml

    from tests.support.installer_host import make_host, put_config

    explain(
        "Step 2. The installer, as the linkerd-cni DaemonSet runs it on each node. Faked here: "
        "the host's /etc/cni/net.d and /opt/cni/bin are a scratch tree (CONTAINER_MOUNT_PREFIX), "
        "the primary CNI's conflist is upstream's Calico test file, and the service-account "
        "token is a test token. The network config is the chart's default ConfigMap value."
    )
    chart = yaml.safe_load_all((REPO_ROOT / "packaging/kubernetes/linkerd-cni.yaml").read_text())
    config = next(d for d in chart if d and d["kind"] == "ConfigMap")["data"]
    host = make_host(demo.workdir / "node")
    conflist = put_config(host, "10-calico.conflist")
    env = host.env(CNIBOX_EXE=str(demo.cnibox), CNI_NETWORK_CONFIG=config["cni_network_config"])
    argv = [str(demo.cnibox), "install-cni", "--once"]
    proc = subprocess.run(argv, env=env, capture_output=True, text=True, timeout=60, check=False)
    if proc.returncode != 0:
        raise SystemExit(f"demo: install-cni --once exited {proc.returncode}: {proc.stderr}")
    shown = host.prefix
    say(f"cnibox install-cni --once   (host root: {shown})", proc.stderr)
    listing = "\n".join(
        f"{p.relative_to(shown)}" + (f" -> {os.readlink(p)}" if p.is_symlink() else "")
        for p in sorted(shown.rglob("*")) if not p.is_dir()
    )  # fmt: skip
    say("what it wrote on the host", listing)
    say(f"{conflist.relative_to(shown)}: linkerd-cni chained last",
        shorten(json.dumps(json.loads(conflist.read_text()), indent=2)))  # fmt: skip
    say(f"{host.kubeconfig.relative_to(shown)} (the plugin's credentials, mode 0600)",
        shorten(host.kubeconfig.read_text()))  # fmt: skip
    argv = [str(demo.cnibox), "install-cni", "--uninstall"]
    proc = subprocess.run(argv, env=env, capture_output=True, text=True, timeout=60, check=False)
    say("cnibox install-cni --uninstall (the DaemonSet's preStop: the node as it was)",
        proc.stderr + f"exit status {proc.returncode}")  # fmt: skip


def step_pod_network(demo: Demo) -> None:
    """A node netns with a bridge, and a pod netns with eth0 on it (the rig's throwaways)."""
    explain(
        "Step 3. A node and a pod. Faked here: both are network namespaces on this machine "
        "(a bridge in the node's, a veth into the pod's) instead of a kubelet's sandbox."
    )
    node = demo.rig.node(bridge=BRIDGE)
    demo.node_pod = demo.rig.pod(node, bridge=BRIDGE)
    say(
        "node and pod network namespaces",
        f"node: {node.path} (bridge {BRIDGE})\n"
        f"pod:  {demo.pod.netns.path} (eth0 {demo.pod.address})",
    )


def step_pod_addresses(demo: Demo) -> None:
    explain(
        "Step 4. cnibox as nsenter (util-linux 2.38.1 compatible), for nodes that have none: "
        "the pod's addresses, seen from inside its network namespace."
    )
    out = demo.nsenter(f"--net={demo.pod.netns.path}", "--", "ip", "-brief", "addr")
    say(f"nsenter --net={demo.pod.netns.path} -- ip -brief addr", out)


def step_pod_proc_net_dev(demo: Demo) -> None:
    explain("Step 5. The same without `--`: the pod's own /proc/net/dev (its interfaces).")
    out = demo.nsenter(f"--net={demo.pod.netns.path}", "cat", "/proc/net/dev")
    say(f"nsenter --net={demo.pod.netns.path} cat /proc/net/dev", out)


def step_linkerd_call(demo: Demo) -> None:
    """Upstream Linkerd's exact call, after a rule is put in the pod with iptables-nft."""
    explain(
        "Step 6. Linkerd's own Go plugin runs `nsenter --net=POD -- iptables-nft-save`; on "
        "Talos that fails for want of nsenter. Faked here: a chain is put into the pod first "
        "with Debian's iptables-nft (a host tool, used only by this demo) so the call has "
        "something to print. On a node, linkerd-cni writes the rules itself (step 7)."
    )
    pod = demo.pod.netns
    pod.exec(["iptables-nft", "-t", "nat", "-N", "PROXY_INIT_REDIRECT"])
    pod.exec(["iptables-nft", "-t", "nat", "-A", "PREROUTING", "-j", "PROXY_INIT_REDIRECT"])
    out = demo.nsenter(f"--net={pod.path}", "--", "iptables-nft-save", "-t", "nat")
    say(f"nsenter --net={pod.path} -- iptables-nft-save -t nat", out)


def step_linkerd_cni(demo: Demo) -> None:
    """The real libcni runs bridge + host-local, then linkerd-cni (cnibox), for a meshed pod
    (upstream's injected manifest, served by a TLS test API server in the node netns) and a
    plain one; the meshed pod's nat table is printed and TCP shows the redirection."""
    from tests.support import FIXTURES
    from tests.support.kubeapi import KubeApi, pods_from_golden
    from tests.support.libcni import Runtime, build_driver, conflist, plugin_dir, primary_plugin
    from tests.support.pki import make_pki

    explain(
        "Step 7. A pod sandbox as containerd sets it up: the real libcni runs the chain bridge "
        "+ host-local + linkerd-cni (cnibox). Faked here: the Kubernetes API is a TLS test "
        "server in the node's namespace serving Linkerd's own injected emojivoto pod; the "
        "plugin reads it, programs PROXY_INIT_* in the pod's namespace in-process (no "
        "iptables binary), and logs to the config's log_file as well as to stderr."
    )
    golden = FIXTURES / "upstream" / "linkerd2" / "inject-goldens"
    meshed = pods_from_golden(golden / "inject_emojivoto_deployment_no_init_container.golden.yml")[
        0
    ]
    node = demo.rig.node()
    api = KubeApi(make_pki(demo.workdir / "pki"))
    api.add_pod(meshed)
    api.start(node.path)
    try:
        cache = demo.workdir / "cni-cache"
        cache.mkdir()
        runtime = Runtime(
            build_driver(), node.name, plugin_dir(demo.workdir / "cni-bin", str(demo.cnibox)), cache
        )
        primary = primary_plugin("bridge", demo.workdir / "ipam", "10.89.0.0/24", "cbxdemo0")
        conf = conflist(
            primary, api.kubeconfig(demo.workdir / "ZZZ-linkerd-cni-kubeconfig"), log_level="info"
        )
        log_file = demo.workdir / "linkerd-cni.log"
        conf["plugins"][-1]["log_file"] = str(log_file)
        meshed_ns, plain_ns = demo.rig.pod().netns, demo.rig.pod().netns
        ips = []
        for netns, pod in ((meshed_ns, meshed), (plain_ns, None)):
            identity = (
                None if pod is None else (pod["metadata"]["namespace"], pod["metadata"]["name"])
            )
            proc = runtime.run("add", conf, netns.path, container_id=f"c{netns.name}", pod=identity)
            if proc.returncode != 0:
                raise SystemExit(f"demo: libcni ADD failed: {proc.stderr}")
            ips.append(json.loads(proc.stdout)["ips"][0]["address"].split("/", maxsplit=1)[0])
        say(
            f"libcni ADD bridge + host-local + linkerd-cni: meshed pod {ips[0]}, plain pod {ips[1]}"
        )
        say(f"iptables-nft-save -t nat in the meshed pod ({meshed_ns.name})",
            meshed_ns.exec(["iptables-nft-save", "-t", "nat"]))  # fmt: skip
        meta = meshed["metadata"]
        check = runtime.run("check", conf, meshed_ns.path, container_id=f"c{meshed_ns.name}",
                            pod=(meta["namespace"], meta["name"]))  # fmt: skip
        say("libcni CHECK of the meshed pod", f"exit status {check.returncode}")
        say("iptables-verify --netns (cnibox reads the pod's nat table itself)",
            _verify(demo, conf, meshed, meshed_ns))  # fmt: skip
        say("TCP through the rules (the answer is the port of the listener that accepted)",
            _traffic(meshed_ns, plain_ns, ips[0], ips[1]))  # fmt: skip
        say(f"the plugin's log lines ({log_file}, log_level info)", log_file.read_text())
        _failure(runtime, conf, demo.rig.pod().netns, log_file)
    finally:
        api.stop()


def _failure(runtime: object, conf: dict[str, object], netns: Netns, log_file: Path) -> None:
    """An ADD for a pod the API does not know: what the runtime reports, and the log line."""
    from tests.support.libcni import Runtime

    assert isinstance(runtime, Runtime)
    explain(
        "A failed ADD: a pod the API server does not know. The runtime gets the CNI error "
        "(kubelet shows it in the pod's events) but libcni drops a failing plugin's stderr, so "
        "the node's log would not show why: the log_file line does, with the pod's fields."
    )
    before = log_file.read_text()
    proc = runtime.run("add", conf, netns.path, container_id=f"c{netns.name}",
                       pod=("emojivoto", "ghost-7d4f8c9b5-x2x4q"))  # fmt: skip
    reported = proc.stderr.strip() or proc.stdout.strip()
    say("libcni ADD of pod emojivoto/ghost-7d4f8c9b5-x2x4q",
        f"exit status {proc.returncode}\n{reported}")  # fmt: skip
    say("the new line in the log file", log_file.read_text().removeprefix(before))


def step_next(demo: Demo) -> None:
    say(
        "next: a real cluster",
        "Talos:   docs/talos.md (the chart with talos.extension, or the DaemonSet alone)\n"
        "Others:  kubectl create namespace linkerd-cni  (label it privileged: docs/helm.md)\n"
        "         helm install linkerd2-cni packaging/helm/linkerd2-cni -n linkerd-cni \\\n"
        "             --set image.name=REGISTRY/cnibox-installer \\\n"
        "             --set logFile=/var/log/linkerd-cni.log\n"
        "         linkerd install --crds | kubectl apply -f -\n"
        "         linkerd install --linkerd-cni-enabled | kubectl apply -f -\n"
        "         linkerd check --linkerd-cni-enabled\n"
        "Meshed pods then start with linkerd-network-validator instead of linkerd-init: it\n"
        'fails the pod if the redirect is not in place (README.md, "Quick start").',
    )


def _verify(demo: Demo, conf: dict[str, object], pod: dict[str, object], netns: Netns) -> str:
    conf_file, pod_file = demo.workdir / "conflist.json", demo.workdir / "pod.json"
    conf_file.write_text(json.dumps(conf))
    pod_file.write_text(json.dumps(pod))
    link = demo.links / "iptables-verify"
    if not link.exists():
        link.symlink_to(demo.cnibox)
    argv = [str(link), "--config", str(conf_file), "--pod", str(pod_file), "--netns", netns.path,
            "--mode", "nft"]  # fmt: skip
    proc = subprocess.run(argv, capture_output=True, text=True, timeout=60, check=False)
    if proc.returncode != 0:
        raise SystemExit(
            f"demo: iptables-verify exited {proc.returncode}: {proc.stdout}{proc.stderr}"
        )
    return f"exit status 0\n{proc.stdout}{proc.stderr}".rstrip()


def _traffic(meshed: Netns, plain: Netns, meshed_ip: str, plain_ip: str) -> str:
    from tests.support.libcni import TCP_PROBE

    probe = str(TCP_PROBE)
    listeners = [meshed.popen([sys.executable, probe, "listen", "4143", "4140", "8080"]),
                 plain.popen([sys.executable, probe, "listen", "9999"])]  # fmt: skip
    try:
        for proc in listeners:
            assert proc.stdout is not None
            proc.stdout.readline()
        lines = []
        for what, netns, host, port, uid, expected in (
            ("plain pod -> meshed:8080", plain, meshed_ip, "8080", None, "4143"),
            ("meshed pod (uid 1000) -> plain:9999", meshed, plain_ip, "9999", "1000", "4140"),
            ("meshed pod (uid 2102, the proxy) -> plain:9999", meshed, plain_ip, "9999", "2102",
             "9999"),
        ):  # fmt: skip
            argv = [sys.executable, probe, "connect", host, port, *([uid] if uid else [])]
            answer = netns.exec(argv, check=False).strip()
            if answer != expected:
                raise SystemExit(f"demo: {what} was answered by {answer!r}, not {expected}")
            lines.append(f"{what}: answered by port {answer}")
        return "\n".join(lines)
    finally:
        for proc in listeners:
            proc.kill()
            proc.communicate()


STEPS: list[Callable[[Demo], None]] = [
    step_links,
    step_installer,
    step_pod_network,
    step_pod_addresses,
    step_pod_proc_net_dev,
    step_linkerd_call,
    step_linkerd_cni,
    step_next,
]


def main() -> int:
    if os.geteuid() != 0:
        print("demo: needs root (network namespaces)", file=sys.stderr)
        return 1
    rig = Rig()
    try:
        with tempfile.TemporaryDirectory(prefix="cnibox-demo-") as tmp:
            demo = Demo(rig, Path(tmp), find_cnibox())
            for step in STEPS:
                step(demo)
    finally:
        names = [ns.name for ns in rig.made]
        rig.cleanup()
        say("cleaned up", "removed netns " + " ".join(names) if names else "nothing to remove")
    return 0


if __name__ == "__main__":
    raise SystemExit(main())

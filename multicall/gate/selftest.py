"""The gate's self-test: one ADD, CHECK and DEL of the installed plugin file, exec'd with CNI
env and the linkerd entry read back from the chained config, into a scratch netns that is
made here and always goes away.

Why a synthetic pod, served from here: ADD only programs rules for a meshed pod, and a real
one would need a pod object this node may create (more authority than get/patch on its own
node). So the plugin's kubeconfig for this one call points at a plain-HTTP answer on this
process's loopback that serves one meshed pod; everything else is the production path: the
installed file (the binary or the agent's launcher), the config as chained, the firewall
backend it names, and CHECK comparing the live nat table with what ADD must have written.

Nothing survives this process, also when it is SIGKILLed: the netns is held only by an fd
of this process (ns.scratch_netns, never a bind mount); the kubeconfig is a memfd, named to
the plugin as /proc/self/fd/N; the answering socket is this process's; the rules live in
the netns. A plugin child that outlives a deadline is killed before the fds are closed.
"""

from __future__ import annotations

import contextlib
import json
import os
import signal
import socket
import subprocess
import threading
import time
from collections.abc import Callable, Iterator, Mapping
from dataclasses import dataclass

from multicall.core.limits import INSTALLER_FILE
from multicall.effects import ns

NAMESPACE = "cnibox-selftest"
POD = "selftest"
PLUGIN_DEADLINE = 20.0  # one plugin exec; a cold single file unpacks on its first start
REQUEST_LIMIT = 8192  # the head of one GET from the plugin
# What of this process's environment the plugin sees: the launcher's and the API client's
# knobs (CNIBOX_*), and what runs a source tree (tests); never the service account.
PASSED_ENV = ("PATH", "PYTHONPATH", "CNIBOX_KUBE_TIMEOUT", "CNIBOX_CACHE", "CNIBOX_AGENT_SOCKET")


@dataclass(frozen=True, slots=True)
class Outcome:
    """What one self-test run found, and how long it took."""

    ok: bool
    detail: str
    seconds: float


def pod_object() -> dict[str, object]:
    """A pod the plugin meshes: a linkerd-proxy container, nothing on its namespace needed."""
    return {
        "kind": "Pod",
        "apiVersion": "v1",
        "metadata": {
            "name": POD,
            "namespace": NAMESPACE,
            "annotations": {"config.linkerd.io/skip-outbound-ports": "4567"},
        },
        "spec": {"containers": [{"name": "linkerd-proxy"}, {"name": "app"}]},
    }


def namespace_object() -> dict[str, object]:
    return {"kind": "Namespace", "apiVersion": "v1", "metadata": {"name": NAMESPACE}}


class PodAnswer:
    """A plain-HTTP/1.1 loop on 127.0.0.1 that answers the plugin's GETs for the one pod and
    its namespace (404 for anything else), one request per connection."""

    def __init__(self) -> None:
        self.listener = socket.socket(socket.AF_INET, socket.SOCK_STREAM)
        self.listener.bind(("127.0.0.1", 0))
        self.listener.listen(8)
        self.listener.settimeout(0.2)
        self.port: int = self.listener.getsockname()[1]
        self.stopping = threading.Event()
        self.thread = threading.Thread(target=self._serve, name="gate-selftest-api", daemon=True)
        self.thread.start()

    def close(self) -> None:
        self.stopping.set()
        self.thread.join(5)
        self.listener.close()

    def _serve(self) -> None:
        while not self.stopping.is_set():
            try:
                conn, _ = self.listener.accept()
            except TimeoutError:
                continue
            except OSError:
                return
            with conn, contextlib.suppress(OSError):
                self._answer(conn)

    def _answer(self, conn: socket.socket) -> None:
        conn.settimeout(5)
        head = b""
        while b"\r\n\r\n" not in head and len(head) < REQUEST_LIMIT:
            chunk = conn.recv(REQUEST_LIMIT - len(head))
            if not chunk:
                return
            head += chunk
        target = head.split(b" ", 2)[1].split(b"?", 1)[0].decode("ascii", "replace")
        found = {
            f"/api/v1/namespaces/{NAMESPACE}/pods/{POD}": pod_object(),
            f"/api/v1/namespaces/{NAMESPACE}": namespace_object(),
        }.get(target)
        status = "200 OK" if found else "404 Not Found"
        body = json.dumps(found or {"kind": "Status", "code": 404, "reason": "NotFound"}).encode()
        conn.sendall(
            f"HTTP/1.1 {status}\r\nContent-Type: application/json\r\n"
            f"Content-Length: {len(body)}\r\nConnection: close\r\n\r\n".encode()
            + body
        )


def kubeconfig_text(port: int) -> str:
    return json.dumps(
        {
            "apiVersion": "v1",
            "kind": "Config",
            "clusters": [{"name": "selftest", "cluster": {"server": f"http://127.0.0.1:{port}"}}],
            "users": [{"name": "selftest", "user": {"token": "selftest"}}],
            "contexts": [
                {
                    "name": "linkerd-cni-context",
                    "context": {"cluster": "selftest", "user": "selftest"},
                }
            ],
            "current-context": "linkerd-cni-context",
        }
    )


def network_config(linkerd: Mapping[str, object], kubeconfig_path: str) -> bytes:
    """The chained linkerd entry as a one-plugin config of its own (no prevResult: ADD then
    prints an empty result), its kubeconfig swapped for the self-test's."""
    entry = dict(linkerd)
    kube = entry.get("kubernetes")
    entry["kubernetes"] = {
        **(kube if isinstance(kube, Mapping) else {}),
        "kubeconfig": kubeconfig_path,
    }
    entry.setdefault("cniVersion", "1.0.0")
    entry.setdefault("name", "linkerd-cni-selftest")
    return json.dumps(entry).encode()


@contextlib.contextmanager
def _memfd(data: bytes) -> Iterator[int]:
    fd = os.memfd_create("cnibox-selftest-kubeconfig", os.MFD_CLOEXEC)
    try:
        os.write(fd, data)
        yield fd
    finally:
        os.close(fd)


def run_selftest(
    plugin: str, bin_dir: str, linkerd: Mapping[str, object], env: Mapping[str, str]
) -> Outcome:
    """ADD, CHECK and DEL of `plugin` in a scratch netns; ok when all three exit 0."""
    started = time.monotonic()
    netns_fd = ns.scratch_netns()
    if netns_fd is None:
        return Outcome(False, "cannot make a scratch netns (no CAP_SYS_ADMIN)", 0.0)
    answer: PodAnswer | None = None
    try:
        answer = PodAnswer()
        with _memfd(kubeconfig_text(answer.port).encode()) as kube_fd:
            config = network_config(linkerd, f"/proc/self/fd/{kube_fd}")
            if len(config) > INSTALLER_FILE:
                return Outcome(False, "the chained linkerd entry is too large", 0.0)
            cni_env = {k: env[k] for k in PASSED_ENV if env.get(k)}
            cni_env.update(
                CNI_CONTAINERID=f"cnibox-selftest-{os.getpid()}",
                CNI_NETNS=f"/proc/self/fd/{netns_fd}",
                CNI_IFNAME="eth0",
                CNI_PATH=bin_dir,
                CNI_ARGS=f"K8S_POD_NAMESPACE={NAMESPACE};K8S_POD_NAME={POD}",
            )
            for command in ("ADD", "CHECK", "DEL"):
                problem = _exec(
                    plugin, {**cni_env, "CNI_COMMAND": command}, config, (netns_fd, kube_fd)
                )
                if problem:
                    return Outcome(False, f"{command}: {problem}", time.monotonic() - started)
        return Outcome(True, "", time.monotonic() - started)
    except OSError as exc:
        return Outcome(False, f"{exc.strerror or exc}", time.monotonic() - started)
    finally:
        if answer is not None:
            answer.close()
        os.close(netns_fd)  # the last reference: the netns and its rules go


PR_SET_PDEATHSIG = 1


def _die_with_parent() -> Callable[[], None]:
    """The plugin child gets SIGKILL when the thread that forked it ends (the gate killed,
    too): it holds the scratch netns fd, which must not outlive this process. The libc call
    is looked up here, so the child between fork and exec only makes it."""
    prctl = ns.libc().prctl

    def child() -> None:
        prctl(PR_SET_PDEATHSIG, signal.SIGKILL, 0, 0, 0)

    return child


def _exec(plugin: str, env: Mapping[str, str], stdin: bytes, fds: tuple[int, ...]) -> str:
    """'' when the plugin exits 0; else its CNI error message, bounded."""
    try:
        proc = subprocess.Popen(  # the installed plugin, no shell
            [plugin],
            stdin=subprocess.PIPE,
            stdout=subprocess.PIPE,
            stderr=subprocess.PIPE,
            env=dict(env),
            pass_fds=fds,
            close_fds=True,
            preexec_fn=_die_with_parent(),  # noqa: PLW1509 - one async-signal-safe libc call
        )
    except OSError as exc:
        return f"cannot run {plugin}: {exc.strerror or exc}"
    try:
        out, err = proc.communicate(stdin, timeout=PLUGIN_DEADLINE)
    except subprocess.TimeoutExpired:
        proc.kill()
        proc.communicate()
        return f"no answer within {PLUGIN_DEADLINE:g}s"
    if proc.returncode == 0:
        return ""
    return _error_text(out, err, proc.returncode)


def _error_text(out: bytes, err: bytes, code: int) -> str:
    with contextlib.suppress(ValueError, AttributeError):
        doc = json.loads(out[:65536])
        msg = " ".join(str(doc.get(k, "")) for k in ("msg", "details")).strip()
        if msg:
            return msg[:512]
    tail = err.decode("utf-8", "replace").strip().splitlines()[-1:] or [f"exit {code}"]
    return tail[0][:512]

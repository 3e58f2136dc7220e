"""Name resolution inside the API deadline (issue 12, class 1): with a resolver that never
answers, glibc's getaddrinfo alone takes ~10 s (timeout:5, attempts:2); linkerd-cni ADD must
still end within CNIBOX_KUBE_TIMEOUT + 1 s.

The resolver is made unresponsive in a throwaway network and mount namespace (`unshare`):
/etc/resolv.conf is bind-mounted there to name 127.0.0.1, where a UDP socket is bound and
never read. Nothing of the machine's own network or files is touched. Cost: about 3 s.
"""

from __future__ import annotations

import json
import subprocess
import sys
from pathlib import Path

import pytest

from tests.support import cnibox_argv, require_root, require_tool
from tests.support.hostile import cni_env, write_plugin_config

pytestmark = pytest.mark.netns

DEADLINE = 2.0
HOST = "kubernetes.cbx-test.invalid"

# Runs inside the namespaces: a resolver that swallows queries, then the plugin, timed.
INSIDE = """
import json, socket, subprocess, sys, time
silent = socket.socket(socket.AF_INET, socket.SOCK_DGRAM)
silent.bind(("127.0.0.1", 53))
argv, env, stdin = json.loads(sys.argv[1])
started = time.monotonic()
with open(stdin, "rb") as source:
    proc = subprocess.run(argv, env=env, stdin=source, capture_output=True, timeout=60)
print(json.dumps([proc.returncode, proc.stdout.decode(), time.monotonic() - started]))
"""


def test_unresponsive_resolver_costs_the_deadline_only(tmp_path: Path) -> None:
    require_root()
    require_tool("unshare")
    require_tool("mount")
    resolv = tmp_path / "resolv.conf"
    resolv.write_text("nameserver 127.0.0.1\noptions timeout:5 attempts:2\n")
    kubeconfig = tmp_path / "kubeconfig"
    kubeconfig.write_text(
        f"clusters: [{{name: c, cluster: {{server: 'http://{HOST}:6443'}}}}]\n"
        "users: [{name: u, user: {token: t}}]\n"
        "contexts: [{name: linkerd-cni-context, context: {cluster: c, user: u}}]\n"
    )
    config = write_plugin_config(tmp_path / "conf.json", kubeconfig=str(kubeconfig))
    env = cni_env(
        CNI_NETNS="/var/run/netns/cbx-dns-absent",
        CNI_ARGS="K8S_POD_NAMESPACE=emojivoto;K8S_POD_NAME=web",
        CNIBOX_KUBE_TIMEOUT=str(DEADLINE),
    )
    job = json.dumps([cnibox_argv("linkerd-cni"), env, str(config)])
    script = (
        f"ip link set lo up && mount --bind {resolv} /etc/resolv.conf && "
        f'exec {sys.executable} -c "$0" "$1"'
    )
    proc = subprocess.run(
        ["unshare", "--net", "--mount", "sh", "-c", script, INSIDE, job],
        capture_output=True,
        text=True,
        timeout=120,
        check=False,
    )
    assert proc.returncode == 0, proc.stderr
    returncode, stdout, seconds = json.loads(proc.stdout)
    assert returncode == 1
    url = f"http://{HOST}:6443/api/v1/namespaces/emojivoto/pods/web"
    assert json.loads(stdout) == {
        "code": 999,
        "msg": f'Get "{url}": dial tcp: lookup {HOST}: i/o timeout',
    }
    assert seconds < DEADLINE + 1

"""usage: linkerd-cni [--help]  (CNI_COMMAND=ADD|CHECK|DEL|STATUS|GC|VERSION, config on stdin)

Linkerd's chained CNI plugin, a drop-in for upstream's `linkerd-cni` binary: the container
runtime runs it with the CNI_* environment and the plugin's network config on stdin.

  ADD      look the pod up in the Kubernetes API; if it runs linkerd-proxy without
           linkerd-init, program Linkerd's iptables redirect in its network namespace
           (in-process: no nsenter, no iptables binaries); print prevResult unchanged
  CHECK    (cniVersion >= 0.4.0) compare the pod's live nat table with the rules ADD
           would program; a difference is CNI error 999 with the diff in `details`
  DEL      nothing to undo (the rules go with the namespace); succeeds when repeated
  STATUS   (1.1.0) error 50 when the kubeconfig named in the config cannot be read
  GC       nothing to collect
  VERSION  the supported CNI spec versions

Errors are CNI error JSON on stdout with exit status 1, each also logged once at error
level with the pod's ContainerID, Namespace and Pod. Logs go to stderr (level from the
config's `log_level`) and, with the config's `log_file`, to that file as well.
CNIBOX_KUBE_TIMEOUT bounds all API requests of one invocation together (seconds, default 5,
at most 600); CNIBOX_DEBUG logs at debug whatever `log_level` says (docs/linkerd-cni.md).
The config on stdin may be at most 1 MiB.

  -h, --help   this text
  --version    print the version
"""

from __future__ import annotations

from collections.abc import Mapping, Sequence
from typing import BinaryIO


def main(
    argv: Sequence[str],
    env: Mapping[str, str],
    stdin: BinaryIO,
    stdout: BinaryIO,
    stderr: BinaryIO,
) -> int:
    from multicall.core import usage
    from multicall.plugin.run import PluginRequest, read_config_stream, run_plugin

    if argv[1:]:  # a runtime passes none
        usage.parse(argv[1:], usage.options(__doc__ or ""))

    # VERSION never reads stdin: answered from the environment alone.
    config = b"" if env.get("CNI_COMMAND") == "VERSION" else read_config_stream(stdin)
    result = run_plugin(PluginRequest(env=env, stdin=config, stderr=stderr))
    stdout.write(result.stdout)
    stdout.flush()
    return result.exit_code

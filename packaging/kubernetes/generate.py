"""Render the DaemonSet manifests from values.yaml: `generate.py [--check] [OUT_DIR]`.

Writes `linkerd-cni.yaml` (any node: install-cni copies cnibox into the CNI bin dir) and
`linkerd-cni-talos.yaml` (Talos with the cnibox extension: the extension's directory is
mounted read-only and linkerd-cni becomes a link to it). `--check` compares instead of
writing and exits 1 when a committed file is stale.

The objects equal the linkerd2-cni chart's defaults (`linkerd install-cni` output), with
these deliberate differences:
- image: the scratch cnibox installer image, not cr.l5d.io/linkerd/cni-plugin;
- preStop: `cnibox install-cni --uninstall` (exec, no shell in the image) instead of
  `/bin/sh -c "kill -15 1; sleep 15s"`; it stops the running installer and undoes;
- annotation `linkerd.io/created-by`: `cnibox <version>`;
- `resources` is omitted when no value is set (the chart prints an empty `resources:`);
- the Talos variant adds the read-only hostPath mount of the extension's directory.
"""

from __future__ import annotations

import sys
from pathlib import Path
from typing import Any

import yaml

HERE = Path(__file__).resolve().parent
OUTPUTS = ("linkerd-cni.yaml", "linkerd-cni-talos.yaml")
LABEL = {"linkerd.io/cni-resource": "true"}
CONFIG_MAP = "linkerd-cni-config"
INSTALLER = "/usr/local/bin/cnibox"


def network_config(v: dict[str, Any]) -> str:
    """The chart's `cni_network_config` template, rendered the way Helm renders it."""
    inbound = [str(v["proxyAdminPort"]), str(v["proxyControlPort"])]
    inbound += [p for p in str(v["ignoreInboundPorts"]).split(",") if p]
    lines = [
        "{",
        '  "name": "linkerd-cni",',
        '  "type": "linkerd-cni",',
        f'  "log_level": "{v["logLevel"]}",',
        '  "kubernetes": {',
        '      "kubeconfig": "__KUBECONFIG_FILEPATH__"',
        "  },",
        '  "linkerd": {',
        f'    "incoming-proxy-port": {v["inboundProxyPort"]},',
        f'    "outgoing-proxy-port": {v["outboundProxyPort"]},',
        f'    "proxy-uid": {v["proxyUID"]},',
    ]
    if int(v["proxyGID"]) >= 0:
        lines.append(f'    "proxy-gid": {v["proxyGID"]},')
    lines.append(f'    "ports-to-redirect": [{v["portsToRedirect"]}],')
    lines.append(f'    "inbound-ports-to-ignore": [{_quoted(inbound)}],')
    if v["ignoreOutboundPorts"]:
        outbound = [p for p in str(v["ignoreOutboundPorts"]).split(",") if p]
        lines.append(f'    "outbound-ports-to-ignore": [{_quoted(outbound)}],')
    lines += [
        '    "simulate": false,',
        f'    "use-wait-flag": {_bool(v["useWaitFlag"])},',
        f'    "iptables-mode": "{v["iptablesMode"]}",',
        f'    "ipv6": {_bool(not v["disableIPv6"])}',
        "  }",
        "}",
    ]
    return "\n".join(lines)


def _quoted(items: list[str]) -> str:
    return ",".join(f'"{item}"' for item in items)


def _bool(value: object) -> str:
    return "true" if value else "false"


def rbac(v: dict[str, Any]) -> list[dict[str, Any]]:
    ns = v["namespace"]
    return [
        {
            "kind": "Namespace",
            "apiVersion": "v1",
            "metadata": {
                "name": ns,
                "labels": {
                    **LABEL,
                    "config.linkerd.io/admission-webhooks": "disabled",
                    "pod-security.kubernetes.io/enforce": "privileged",
                },
            },
        },
        {
            "apiVersion": "v1",
            "kind": "ServiceAccount",
            "metadata": {"name": "linkerd-cni", "namespace": ns, "labels": dict(LABEL)},
        },
        {
            "kind": "ClusterRole",
            "apiVersion": "rbac.authorization.k8s.io/v1",
            "metadata": {"name": "linkerd-cni", "labels": dict(LABEL)},
            "rules": [
                {
                    "apiGroups": [""],
                    "resources": ["pods", "nodes", "namespaces", "services"],
                    "verbs": ["list", "get", "watch"],
                }
            ],
        },
        {
            "apiVersion": "rbac.authorization.k8s.io/v1",
            "kind": "ClusterRoleBinding",
            "metadata": {"name": "linkerd-cni", "labels": dict(LABEL)},
            "roleRef": {
                "apiGroup": "rbac.authorization.k8s.io",
                "kind": "ClusterRole",
                "name": "linkerd-cni",
            },
            "subjects": [{"kind": "ServiceAccount", "name": "linkerd-cni", "namespace": ns}],
        },
    ]


def config_map(v: dict[str, Any]) -> dict[str, Any]:
    return {
        "kind": "ConfigMap",
        "apiVersion": "v1",
        "metadata": {"name": CONFIG_MAP, "namespace": v["namespace"], "labels": dict(LABEL)},
        "data": {
            "dest_cni_net_dir": v["destCNINetDir"],
            "dest_cni_bin_dir": v["destCNIBinDir"],
            "cni_network_config": network_config(v),
        },
    }


def _env_from_config(name: str, key: str) -> dict[str, Any]:
    return {"name": name, "valueFrom": {"configMapKeyRef": {"name": CONFIG_MAP, "key": key}}}


def volumes(v: dict[str, Any], talos: bool) -> tuple[list[dict[str, Any]], list[dict[str, Any]]]:
    """The container's mounts and the pod's volumes (one host mount if both dirs are one)."""
    mounts: list[dict[str, Any]] = []
    vols: list[dict[str, Any]] = []
    dirs = [("cni-bin-dir", v["destCNIBinDir"]), ("cni-net-dir", v["destCNINetDir"])]
    if v["destCNIBinDir"] == v["destCNINetDir"]:
        dirs = dirs[1:]
    for name, path in dirs:
        mounts.append({"mountPath": f"/host{path}", "name": name})
        vols.append({"name": name, "hostPath": {"path": path}})
    mounts.append({"mountPath": "/tmp", "name": "linkerd-tmp-dir"})
    vols.append({"name": "linkerd-tmp-dir", "emptyDir": {}})
    if talos:
        ext_dir = v["talosHostBinary"].rsplit("/", 1)[0]
        mounts.append(
            {"mountPath": f"/host{ext_dir}", "name": "cnibox-extension", "readOnly": True}
        )
        vols.append(
            {"name": "cnibox-extension", "hostPath": {"path": ext_dir, "type": "Directory"}}
        )
    return mounts, vols


def daemon_set(v: dict[str, Any], talos: bool) -> dict[str, Any]:
    created_by = {"linkerd.io/created-by": f"cnibox {v['image']['version']}"}
    mounts, vols = volumes(v, talos)
    env = [
        _env_from_config("DEST_CNI_NET_DIR", "dest_cni_net_dir"),
        _env_from_config("DEST_CNI_BIN_DIR", "dest_cni_bin_dir"),
        _env_from_config("CNI_NETWORK_CONFIG", "cni_network_config"),
        {"name": "SLEEP", "value": "true"},
    ]
    if talos:
        env.append({"name": "CNIBOX_HOST_BINARY", "value": v["talosHostBinary"]})
    container = {
        "name": "install-cni",
        "image": f"{v['image']['name']}:{v['image']['version']}",
        "imagePullPolicy": v["image"]["pullPolicy"],
        "env": env,
        "lifecycle": {"preStop": {"exec": {"command": [INSTALLER, "install-cni", "--uninstall"]}}},
        "volumeMounts": mounts,
        "securityContext": {"readOnlyRootFilesystem": True, "privileged": v["privileged"]},
    }
    pod_spec: dict[str, Any] = {
        "tolerations": v["tolerations"],
        "nodeSelector": {"kubernetes.io/os": "linux"},
        "securityContext": {"seccompProfile": {"type": "RuntimeDefault"}},
        "serviceAccountName": "linkerd-cni",
    }
    if v["priorityClassName"]:
        pod_spec["priorityClassName"] = v["priorityClassName"]
    pod_spec["containers"] = [container]
    pod_spec["volumes"] = vols
    labels = {"k8s-app": "linkerd-cni", **LABEL}
    return {
        "kind": "DaemonSet",
        "apiVersion": "apps/v1",
        "metadata": {
            "name": "linkerd-cni",
            "namespace": v["namespace"],
            "labels": labels,
            "annotations": created_by,
        },
        "spec": {
            "revisionHistoryLimit": v["revisionHistoryLimit"],
            "selector": {"matchLabels": {"k8s-app": "linkerd-cni"}},
            "updateStrategy": v["updateStrategy"],
            "template": {
                "metadata": {
                    "labels": labels,
                    "annotations": {**created_by, "linkerd.io/inject": "disabled"},
                },
                "spec": pod_spec,
            },
        },
    }


class _Dumper(yaml.SafeDumper):
    def ignore_aliases(self, data: Any) -> bool:
        return True  # a manifest reads better with repeated labels than with &id001 anchors


def _str(dumper: yaml.SafeDumper, text: str) -> yaml.ScalarNode:
    style = "|" if "\n" in text else None
    return dumper.represent_scalar("tag:yaml.org,2002:str", text, style=style)


_Dumper.add_representer(str, _str)


def render(values: dict[str, Any], talos: bool) -> str:
    documents = [*rbac(values), config_map(values), daemon_set(values, talos)]
    header = "# Generated by packaging/kubernetes/generate.py from values.yaml; do not edit.\n"
    body = yaml.dump_all(documents, Dumper=_Dumper, sort_keys=False, explicit_start=True)
    return header + body


def outputs(values: dict[str, Any]) -> dict[str, str]:
    return {OUTPUTS[0]: render(values, talos=False), OUTPUTS[1]: render(values, talos=True)}


def main(argv: list[str]) -> int:
    check = "--check" in argv
    rest = [a for a in argv if a != "--check"]
    out_dir = Path(rest[0]) if rest else HERE
    values = yaml.safe_load((HERE / "values.yaml").read_text())
    stale = []
    for name, text in outputs(values).items():
        path = out_dir / name
        if check:
            if not path.is_file() or path.read_text() != text:
                stale.append(name)
        else:
            path.write_text(text)
    for name in stale:
        sys.stderr.write(f"{out_dir / name} is stale: run packaging/kubernetes/generate.py\n")
    return 1 if stale else 0


if __name__ == "__main__":
    sys.exit(main(sys.argv[1:]))

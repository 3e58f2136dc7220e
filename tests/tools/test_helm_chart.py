"""The Helm chart (packaging/helm/linkerd2-cni) rendered by the real, pinned `helm`.

- `helm lint --strict` with the defaults and with the values of every upstream golden;
- `helm template` with Linkerd's own values.yaml and with the values behind each of Linkerd's
  golden renderings (cli/cmd/testdata of linkerd2): `cni_network_config` equals the golden's
  byte for byte, and every other difference from the golden is one listed in docs/helm.md
  ("Differences from Linkerd's rendering"); a listed difference no case produces fails too;
- every key of Linkerd's values.yaml is accepted with its default and changes the rendering
  where Linkerd's template uses it;
- the rendered objects pass the Kubernetes API's own JSON schemas (kubernetes-validate,
  strict: no unknown field), offline;
- no container of a rendered DaemonSet runs a shell: every command, probe and hook is the
  image's cnibox, by its own path or an applet's link;
- every container has a directory it may unpack the single file into;
- bad values fail at render time, naming the key (values.schema.json);
- the committed plain manifests are `helm template` output (packaging/helm/manifests.py).
"""

from __future__ import annotations

import copy
import json
import os
import re
import subprocess
import sys
import tempfile
from collections.abc import Iterator, Mapping
from dataclasses import dataclass
from pathlib import Path
from typing import Any

import pytest
import yaml

from multicall import __version__
from multicall.applets import APPLETS
from tests.support import FIXTURES, REPO
from tests.support.helm import manifests, pinned_helm

CHART = manifests.CHART
GOLDENS = FIXTURES / "upstream" / "linkerd2" / "cli-install-cni-goldens"
UPSTREAM_VALUES = FIXTURES / "upstream" / "linkerd2" / "charts-linkerd2-cni" / "values.yaml"
DOC = REPO / "docs" / "helm.md"
IMAGE_LAYOUT = json.loads((REPO / "packaging" / "image" / "layout.json").read_text())
INSTALLER = "/" + IMAGE_LAYOUT["binary"]
APPLET_LINKS = "/" + IMAGE_LAYOUT["applet_links_dir"]  # the image links every applet name here
SHELLS = {"sh", "bash", "ash", "dash", "zsh", "ksh", "busybox"}
APPLET_NAMES = {name for applet in APPLETS for name in applet.names}


def render(
    values: Mapping[str, Any] | None = None,
    namespace: str = "linkerd-test",
    values_file: Path | None = None,
    tmp: Path | None = None,
) -> str:
    files = [values_file] if values_file else []
    if values:
        assert tmp is not None
        path = tmp / f"values-{len(list(tmp.iterdir()))}.yaml"
        path.write_text(yaml.safe_dump(dict(values)))
        files.append(path)
    return manifests.helm_template(pinned_helm(), values_files=files, namespace=namespace)


AGENT = "DaemonSet/linkerd-cni-agent"  # cnibox's own DaemonSet (agent.enabled)


def objects(text: str) -> dict[str, dict[str, Any]]:
    """The rendered objects by kind (the chart renders at most one object of each kind of
    Linkerd's), and the agent's DaemonSet, which Linkerd's chart does not have, as AGENT."""
    docs = [d for d in yaml.safe_load_all(text) if d]
    by_kind = {
        AGENT if f"{d['kind']}/{d['metadata']['name']}" == AGENT else d["kind"]: d for d in docs
    }
    assert len(by_kind) == len(docs), "two objects of one kind"
    return by_kind


def pods(rendered: Mapping[str, dict[str, Any]]) -> dict[str, dict[str, Any]]:
    """The pod spec of each DaemonSet, by the DaemonSet's name."""
    return {
        doc["metadata"]["name"]: doc["spec"]["template"]["spec"]
        for doc in rendered.values()
        if doc["kind"] == "DaemonSet"
    }


# --- the values behind each of Linkerd's goldens ----------------------------------------------

# `linkerd install-cni` passes no pull policy and its own plugin version (cli/cmd/
# install-cni-plugin.go); `cliVersion` is what the CLI sets as the created-by annotation.
CLI = {"cliVersion": "linkerd/cli dev-undefined", "installNamespace": True}
CLI_IMAGE = {"name": "cr.l5d.io/linkerd/cni-plugin", "version": "v1.6.8", "pullPolicy": ""}
# cli/cmd/install-cni-plugin_test.go: fullyConfiguredOptions. Its --admin-port/--control-port
# (5191/5190) never reach the chart (a CLI quirk, docs/upstream-behaviour.md §7): absent.
FULLY = {
    **CLI,
    "inboundProxyPort": 5143,
    "outboundProxyPort": 5140,
    "proxyUID": 12102,
    "proxyGID": 12102,
    "logLevel": "debug",
    "destCNINetDir": "/etc/kubernetes/cni/net.d",
    "destCNIBinDir": "/opt/my-cni/bin",
    "priorityClassName": "system-node-critical",
    "image": {
        "name": "my-docker-registry.io/awesome/cni-plugin-test-image",
        "version": "v1.4.0",
        "pullPolicy": "",
    },
}
# Golden file -> (namespace, values) as linkerd2's TestRenderCNIPlugin / TestRenderCniHelm
# render it (cli/cmd/install-cni-plugin_test.go, cli/cmd/install_cni_helm_test.go).
GOLDEN_VALUES: dict[str, tuple[str, dict[str, Any]]] = {
    "install-cni-plugin_default.golden": (
        "linkerd-cni",
        {**CLI, "image": CLI_IMAGE, "resources": {"cpu": {"limit": "1m"}}},
    ),
    "install-cni-plugin_fully_configured.golden": ("linkerd-cni", FULLY),
    "install-cni-plugin_fully_configured_equal_dsts.golden": (
        "linkerd-cni",
        {**FULLY, "destCNIBinDir": "/etc/kubernetes/cni/net.d"},
    ),
    "install-cni-plugin_fully_configured_no_namespace.golden": ("linkerd-cni", FULLY),
    "install-cni-plugin_skip_ports.golden": (
        "linkerd-cni",
        {
            **CLI,
            "image": CLI_IMAGE,
            "ignoreInboundPorts": "80,8080",
            "ignoreOutboundPorts": "443,1000",
        },
    ),
    "install_cni_helm_default_output.golden": (
        "linkerd-test",
        {
            "cliVersion": "linkerd/cli dev-undefined",
            "image": {"name": "cr.l5d.io/linkerd/cni-plugin", "version": "v1.7.0-alpha.1"},
        },
    ),
    "install_cni_helm_override_output.golden": (
        "linkerd-test",
        {
            "inboundProxyPort": 1234,
            "outboundProxyPort": 5678,
            "logLevel": "debug",
            "proxyUID": 1111,
            "proxyGID": 1111,
            "destCNINetDir": "/etc/cni/net.d-test",
            "destCNIBinDir": "/opt/cni/bin-test",
            "useWaitFlag": True,
            "cliVersion": "test-version",
            "priorityClassName": "system-node-critical",
            "image": {"name": "cr.l5d.io/linkerd/cni-plugin", "version": "v1.4.0"},
        },
    ),
}

# The repair-controller container and ClusterRole rules Linkerd's template renders with
# `repairController.enabled=true` and the defaults (linkerd2 charts/linkerd2-cni/templates/
# cni-plugin.yaml at L2-HEAD, the fixture TestKeyByKey renders). There is no golden for it.
UPSTREAM_REPAIR_RULES = [
    {"apiGroups": [""], "resources": ["pods"], "verbs": ["delete"]},
    {"apiGroups": ["events.k8s.io"], "resources": ["events"], "verbs": ["create"]},
]
UPSTREAM_REPAIR_MINIMAL = {
    "name": "repair-controller",
    "image": "cr.l5d.io/linkerd/cni-plugin:v1.7.0-alpha.1",
    "imagePullPolicy": "IfNotPresent",
}
UPSTREAM_REPAIR_CONTAINER = {
    **UPSTREAM_REPAIR_MINIMAL,
    "env": [
        {
            "name": "LINKERD_CNI_REPAIR_CONTROLLER_NODE_NAME",
            "valueFrom": {"fieldRef": {"fieldPath": "spec.nodeName"}},
        },
        {
            "name": "LINKERD_CNI_REPAIR_CONTROLLER_POD_NAME",
            "valueFrom": {"fieldRef": {"fieldPath": "metadata.name"}},
        },
    ],
    "command": ["/usr/lib/linkerd/linkerd-cni-repair-controller"],
    "args": ["--admin-addr", "0.0.0.0:9990", "--log-format", "plain", "--log-level", "info"],
    "livenessProbe": {"httpGet": {"path": "/live", "port": "repair-admin"}},
    "readinessProbe": {
        "failureThreshold": 7,
        "httpGet": {"path": "/ready", "port": "repair-admin"},
        "initialDelaySeconds": 10,
    },
    "ports": [{"containerPort": 9990, "name": "repair-admin"}],
    "securityContext": {
        "allowPrivilegeEscalation": False,
        "capabilities": {"drop": ["ALL"]},
        "privileged": False,
        "readOnlyRootFilesystem": True,
        "seccompProfile": {"type": "RuntimeDefault"},
    },
}


def golden_objects(name: str) -> dict[str, dict[str, Any]]:
    return objects((GOLDENS / name).read_text())


def with_repair_controller(
    upstream: dict[str, dict[str, Any]], container: dict[str, Any]
) -> dict[str, dict[str, Any]]:
    result = copy.deepcopy(upstream)
    result["ClusterRole"]["rules"] += UPSTREAM_REPAIR_RULES
    result["DaemonSet"]["spec"]["template"]["spec"]["containers"].append(container)
    return result


@dataclass(frozen=True)
class Case:
    """One rendering of our chart and the upstream rendering it is compared with."""

    name: str
    namespace: str
    values: dict[str, Any]
    upstream: str  # golden file the upstream objects come from
    values_file: Path | None = None
    repair: dict[str, Any] | None = None  # upstream repair-controller container, if enabled


CASES = [
    Case("our-defaults", "linkerd-test", {}, "install_cni_helm_default_output.golden"),
    Case(
        "linkerd-values-yaml",
        "linkerd-test",
        {"cliVersion": "linkerd/cli dev-undefined"},
        "install_cni_helm_default_output.golden",
        values_file=UPSTREAM_VALUES,
    ),
    *(Case(f"golden:{name}", ns, vals, name) for name, (ns, vals) in GOLDEN_VALUES.items()),
    Case(
        "repair-controller",
        "linkerd-test",
        {"repairController": {"enabled": True}, "cliVersion": "linkerd/cli dev-undefined"},
        "install_cni_helm_default_output.golden",
        values_file=UPSTREAM_VALUES,
        repair=UPSTREAM_REPAIR_CONTAINER,
    ),
    Case(
        "repair-controller-without-security-context",
        "linkerd-test",
        {
            "repairController": {"enabled": True, "enableSecurityContext": False},
            "cliVersion": "linkerd/cli dev-undefined",
        },
        "install_cni_helm_default_output.golden",
        values_file=UPSTREAM_VALUES,
        repair=UPSTREAM_REPAIR_MINIMAL,
    ),
]


# --- structural comparison --------------------------------------------------------------------


def flatten(value: Any, path: str) -> Iterator[tuple[str, Any]]:
    """Leaf paths of a YAML value; lists of named objects are keyed by name, null is absent
    (the API server treats an explicit null like an absent field)."""
    if value is None:
        return
    if isinstance(value, dict) and value:
        for key, item in value.items():
            yield from flatten(item, f"{path}.{key}")
    elif isinstance(value, list) and value and all(isinstance(i, dict) for i in value):
        named = all("name" in i for i in value)
        for index, item in enumerate(value):
            yield from flatten(item, f"{path}[{item['name'] if named else index}]")
    else:
        yield path, value


def differences(
    upstream: Mapping[str, dict[str, Any]], ours: Mapping[str, dict[str, Any]]
) -> dict[str, tuple[Any, Any]]:
    """`Kind:path` -> (upstream value, our value), None standing for absent."""
    found: dict[str, tuple[Any, Any]] = {}
    for kind in sorted(set(upstream) | set(ours)):
        theirs = dict(flatten(upstream.get(kind), kind))
        mine = dict(flatten(ours.get(kind), kind))
        for path in sorted(set(theirs) | set(mine)):
            if theirs.get(path) != mine.get(path):
                label = path.replace(f"{kind}.", f"{kind}:", 1)
                found[label] = (theirs.get(path), mine.get(path))
    return found


def documented_differences() -> list[str]:
    """The first column of docs/helm.md's table "Differences from Linkerd's rendering"."""
    text = DOC.read_text()
    section = text.split("## Differences from Linkerd's rendering", 1)[1].split("\n## ", 1)[0]
    # `Kind:field`, or `Kind/name` for a whole object of cnibox's own (the agent's DaemonSet)
    return re.findall(r"^\| `([A-Za-z]+(?::[^`]+|/[a-z0-9-]+))` \|", section, re.MULTILINE)


def covered(path: str, documented: list[str]) -> str | None:
    for entry in documented:
        if path == entry or path.startswith((entry + ".", entry + "[", entry + ":")):
            return entry
    return None


@pytest.fixture(scope="module")
def rendered(tmp_path_factory: pytest.TempPathFactory) -> dict[str, str]:
    tmp = tmp_path_factory.mktemp("values")
    return {case.name: render(case.values, case.namespace, case.values_file, tmp) for case in CASES}


def upstream_objects(case: Case) -> dict[str, dict[str, Any]]:
    upstream = golden_objects(case.upstream)
    if case.repair is not None:
        upstream = with_repair_controller(upstream, case.repair)
    return upstream


class TestAgainstLinkerd:
    @pytest.mark.parametrize("case", CASES, ids=lambda c: c.name)
    def test_network_config_is_byte_identical(self, case: Case, rendered: dict[str, str]) -> None:
        """cni_network_config is exactly the golden's (what the installer chains into CNI)."""
        ours = objects(rendered[case.name])["ConfigMap"]["data"]
        theirs = golden_objects(case.upstream)["ConfigMap"]["data"]
        assert ours["cni_network_config"] == theirs["cni_network_config"]
        assert ours == theirs

    @pytest.mark.parametrize("case", CASES, ids=lambda c: c.name)
    def test_every_difference_is_documented(self, case: Case, rendered: dict[str, str]) -> None:
        """Object names, labels, RBAC, volumes...: anything else that differs is in docs/helm.md."""
        found = differences(upstream_objects(case), objects(rendered[case.name]))
        documented = documented_differences()
        unlisted = {p: v for p, v in found.items() if covered(p, documented) is None}
        assert unlisted == {}, "differences not listed in docs/helm.md"

    def test_every_documented_difference_occurs(
        self, rendered: dict[str, str], tmp_path: Path
    ) -> None:
        """No stale row: each listed difference is produced by at least one case, or by the
        key-by-key comparison below (PodSecurityPolicy rows: no golden of Linkerd's has one)."""
        documented = documented_differences()
        assert len(documented) >= 4
        used = {
            covered(path, documented)
            for case in CASES
            for path in differences(upstream_objects(case), objects(rendered[case.name]))
        }
        theirs = objects(render_upstream(DISTINCT, tmp_path))
        ours = objects(render(copy.deepcopy(DISTINCT), tmp=tmp_path))
        used |= {covered(path, documented) for path in differences(theirs, ours)}
        assert set(documented) - used == set()

    def test_object_names_are_what_linkerd_check_looks_up(self, rendered: dict[str, str]) -> None:
        """`linkerd check --linkerd-cni-enabled` reads these by name in the CNI namespace."""
        ours = objects(rendered["our-defaults"])
        names = {kind: doc["metadata"]["name"] for kind, doc in ours.items()}
        assert names == {
            AGENT: "linkerd-cni-agent",  # cnibox's own (on by default): not looked up
            "ServiceAccount": "linkerd-cni",
            "ClusterRole": "linkerd-cni",
            "ClusterRoleBinding": "linkerd-cni",
            "ConfigMap": "linkerd-cni-config",
            "DaemonSet": "linkerd-cni",
        }
        for kind in ("ServiceAccount", "ConfigMap", "DaemonSet"):
            assert ours[kind]["metadata"]["namespace"] == "linkerd-test"
        assert set(ours["ConfigMap"]["data"]) == {
            "dest_cni_net_dir",
            "dest_cni_bin_dir",
            "cni_network_config",
        }


# --- key by key against upstream's newest chart ------------------------------------------------

# linkerd2's charts/linkerd2-cni and charts/partials at L2-HEAD (tests/fixtures/PROVENANCE.md),
# rendered by the same pinned helm: the comparison covers what no golden of theirs shows (the
# repair controller, PSP, every key at once).
UPSTREAM_CHART = FIXTURES / "upstream" / "linkerd2" / "chart-linkerd2-cni"
# Every key of Linkerd's values.yaml set to a value unlike its default and unlike the others,
# so that each lands somewhere visible (the image is not Linkerd's: see test_linkerd_image_*).
DISTINCT: dict[str, Any] = {
    "inboundProxyPort": 5143,
    "outboundProxyPort": 5140,
    "ignoreInboundPorts": "81,8081",
    "ignoreOutboundPorts": "444,1001",
    "proxyAdminPort": 5191,
    "proxyControlPort": 5190,
    "podLabels": {"team": "mesh"},
    "commonLabels": {"owner": "ops"},
    "logLevel": "debug",
    "portsToRedirect": "8080,9090",
    "proxyUID": 12102,
    "proxyGID": 12103,
    "destCNINetDir": "/etc/kubernetes/cni/net.d",
    "destCNIBinDir": "/opt/my-cni/bin",
    "useWaitFlag": True,
    "iptablesMode": "legacy",
    "disableIPv6": False,
    "priorityClassName": "system-cluster-critical",
    "revisionHistoryLimit": 3,
    "updateStrategy": {"type": "OnDelete", "rollingUpdate": {"maxUnavailable": 2}},
    "enablePSP": True,
    "privileged": True,
    "tolerations": [{"key": "k", "operator": "Exists", "effect": "NoSchedule"}],
    "nodeAffinity": {
        "requiredDuringSchedulingIgnoredDuringExecution": {
            "nodeSelectorTerms": [
                {"matchExpressions": [{"key": "a", "operator": "In", "values": ["b"]}]}
            ]
        }
    },
    "image": {
        "name": "registry.example/mirror/cnibox-installer",
        "version": "v9.9.9",
        "pullPolicy": "Always",
    },
    "imagePullSecrets": [{"name": "pull"}],
    "extraInitContainers": [{"name": "wait", "image": "registry.example/wait:1"}],
    "repairController": {
        "enabled": True,
        "logLevel": "debug",
        "logFormat": "json",
        "enableSecurityContext": True,
        "resources": {
            "cpu": {"limit": "2", "request": "1"},
            "memory": {"limit": "64Mi", "request": "32Mi"},
            "ephemeral-storage": {"limit": "2Gi", "request": "1Gi"},
        },
    },
    "resources": {
        "cpu": {"limit": "3", "request": "2"},
        "memory": {"limit": "96Mi", "request": "48Mi"},
        "ephemeral-storage": {"limit": "3Gi", "request": "2Gi"},
    },
    "cliVersion": "linkerd/cli dev-undefined",
}


NO_SECURITY_CONTEXT = {
    **DISTINCT,
    "repairController": {**DISTINCT["repairController"], "enableSecurityContext": False},
}


def render_upstream(values: Mapping[str, Any], tmp: Path, namespace: str = "linkerd-test") -> str:
    """helm template of Linkerd's own chart (its partials as the dependency it names)."""
    import shutil

    chart = tmp / "upstream" / "linkerd2-cni"
    if not chart.exists():
        shutil.copytree(UPSTREAM_CHART / "linkerd2-cni", chart)
        shutil.copytree(UPSTREAM_CHART / "partials", chart / "charts" / "partials")
    path = tmp / "upstream-values.yaml"
    path.write_text(yaml.safe_dump(dict(values)))
    with tempfile.TemporaryDirectory() as home:
        proc = subprocess.run(
            [
                *(pinned_helm(), "template", "linkerd2-cni", str(chart)),
                *("--namespace", namespace, "--kube-version", "1.31.0", "--values", str(path)),
            ],
            capture_output=True,
            text=True,
            check=False,
            env=manifests.helm_environment(home),
        )
    assert proc.returncode == 0, proc.stderr
    return proc.stdout


class TestKeyByKey:
    def test_fixture_values_are_the_charts(self) -> None:
        """The chart fixture's values.yaml is the one the value tests compare with."""
        assert (UPSTREAM_CHART / "linkerd2-cni" / "values.yaml").read_text() == (
            UPSTREAM_VALUES.read_text()
        )

    def test_every_key_is_set(self) -> None:
        """DISTINCT leaves out no key of Linkerd's values.yaml and sets none to its default."""
        theirs = yaml.safe_load(UPSTREAM_VALUES.read_text())
        # nodeAffinity is commented out in their values.yaml, but their template reads it.
        assert set(DISTINCT) - {"cliVersion", "nodeAffinity"} == set(theirs)
        defaults, distinct = leaves(theirs), leaves(DISTINCT)
        unchanged = [
            key
            for key, default in defaults.items()
            if distinct.get(key) == default
            or not any(d == key or d.startswith(key + ".") for d in distinct)
        ]
        # enableSecurityContext=false is the separate case NO_SECURITY_CONTEXT below.
        assert unchanged == ["repairController.enableSecurityContext"]

    @pytest.mark.parametrize(
        "values",
        [{}, DISTINCT, NO_SECURITY_CONTEXT],
        ids=["defaults", "every-key-distinct", "no-security-context"],
    )
    def test_rendered_objects_differ_only_as_documented(
        self, values: dict[str, Any], tmp_path: Path
    ) -> None:
        """Linkerd's newest chart and ours, same values: every difference is in docs/helm.md."""
        if not values:
            values = {"cliVersion": "linkerd/cli dev-undefined"}
        theirs = objects(render_upstream(values, tmp_path))
        ours_values = copy.deepcopy(values)
        if "image" not in ours_values:
            theirs_image = "cr.l5d.io/linkerd/cni-plugin"
            assert theirs_image in json.dumps(theirs["DaemonSet"])
        ours = objects(render(ours_values, tmp=tmp_path))
        found = differences(theirs, ours)
        documented = documented_differences()
        unlisted = {p: v for p, v in found.items() if covered(p, documented) is None}
        assert unlisted == {}, "differences not listed in docs/helm.md"
        assert theirs["ConfigMap"]["data"] == ours["ConfigMap"]["data"]
        if values.get("repairController", {}).get("enableSecurityContext"):
            # Rows of docs/helm.md cover these fields for enableSecurityContext=false only:
            # with it on, names and probes are Linkerd's exactly (scrape configs select the
            # port by name).
            mine, upstream = (
                {c["name"]: c for c in pods(o)["linkerd-cni"]["containers"]}["repair-controller"]
                for o in (ours, theirs)
            )
            for field in ("ports", "livenessProbe", "readinessProbe", "args", "env"):
                assert mine[field] == upstream[field], field


# --- values ---------------------------------------------------------------------------------


def leaves(value: Any, path: str = "") -> dict[str, Any]:
    if isinstance(value, dict) and value:
        out: dict[str, Any] = {}
        for key, item in value.items():
            out.update(leaves(item, f"{path}.{key}" if path else key))
        return out
    return {path: value}


class TestValues:
    def test_chart_version_is_cnibox_version(self) -> None:
        chart = yaml.safe_load((CHART / "Chart.yaml").read_text())
        assert chart["name"] == "linkerd2-cni"
        assert chart["version"] == chart["appVersion"] == __version__
        # The images' org.opencontainers.image.source (packaging/provenance.py) says the same.
        assert chart["sources"] == ["https://github.com/cnibox/cnibox"]

    def test_every_linkerd_key_with_its_default(self) -> None:
        """Every leaf of Linkerd's values.yaml exists here with the same default, but the image."""
        theirs = leaves(yaml.safe_load(UPSTREAM_VALUES.read_text()))
        ours = leaves(yaml.safe_load((CHART / "values.yaml").read_text()))
        assert len(theirs) > 40
        differing = {
            k: (v, ours.get(k, "<missing>")) for k, v in theirs.items() if ours.get(k) != v
        }
        assert differing == {
            "image.name": ("cr.l5d.io/linkerd/cni-plugin", "ghcr.io/cnibox/cnibox-installer"),
            "image.version": ("v1.7.0-alpha.1", ""),
        }

    def test_linkerd_values_change_what_linkerd_template_changes(self, tmp_path: Path) -> None:
        """Keys no golden covers, set to non-defaults, land where Linkerd's template puts them."""
        affinity = {
            "requiredDuringSchedulingIgnoredDuringExecution": {
                "nodeSelectorTerms": [
                    {"matchExpressions": [{"key": "a", "operator": "In", "values": ["b"]}]}
                ]
            }
        }
        init = [{"name": "wait", "image": "registry.example/wait:1", "args": ["15"]}]
        values = {
            "podLabels": {"team": "mesh"},
            "commonLabels": {"owner": "ops"},
            "nodeAffinity": affinity,
            "imagePullSecrets": [{"name": "pull"}],
            "extraInitContainers": init,
            "tolerations": [{"key": "k", "operator": "Exists", "effect": "NoSchedule"}],
            # Helm merges maps with the defaults: null removes rollingUpdate (as in Linkerd's).
            "updateStrategy": {"type": "OnDelete", "rollingUpdate": None},
            "revisionHistoryLimit": 3,
            "privileged": True,
            "disableIPv6": False,
            "iptablesMode": "legacy",
            "portsToRedirect": "8080,9090",
            "priorityClassName": "system-node-critical",
            "resources": {"cpu": {"request": "10m"}, "memory": {"limit": "64Mi"}},
            "repairController": {"enabled": True, "logFormat": "json", "logLevel": "debug"},
        }
        ours = objects(render(values, tmp=tmp_path))
        ds = ours["DaemonSet"]
        pod = ds["spec"]["template"]["spec"]
        for kind, doc in ours.items():
            assert doc["metadata"]["labels"]["owner"] == "ops", kind
        assert ds["spec"]["template"]["metadata"]["labels"] == {
            "k8s-app": "linkerd-cni",
            "linkerd.io/cni-resource": "true",
            "team": "mesh",
        }
        assert pod["affinity"] == {"nodeAffinity": affinity}
        assert ours["ServiceAccount"]["imagePullSecrets"] == [{"name": "pull"}]
        assert pod["initContainers"] == init
        assert pod["tolerations"] == values["tolerations"]
        assert ds["spec"]["updateStrategy"] == {"type": "OnDelete"}
        assert ds["spec"]["revisionHistoryLimit"] == 3
        assert pod["priorityClassName"] == "system-node-critical"
        containers = {c["name"]: c for c in pod["containers"]}
        install = containers["install-cni"]
        assert install["securityContext"]["privileged"] is True
        assert install["resources"] == {"limits": {"memory": "64Mi"}, "requests": {"cpu": "10m"}}
        config = json.loads(ours["ConfigMap"]["data"]["cni_network_config"])["linkerd"]
        assert config["ipv6"] is True
        assert config["iptables-mode"] == "legacy"
        assert config["ports-to-redirect"] == [8080, 9090]
        repair = containers["repair-controller"]
        assert repair["args"] == [
            "--admin-addr",
            "[::]:9990",
            "--log-format",
            "json",
            "--log-level",
            "debug",
        ]

    def test_psp_when_enabled(self, tmp_path: Path) -> None:
        """enablePSP renders the PodSecurityPolicy and its Role/RoleBinding as Linkerd's does."""
        ours = objects(render({"enablePSP": True}, namespace="cni", tmp=tmp_path))
        assert ours["PodSecurityPolicy"]["metadata"]["name"] == "linkerd-cni-cni"
        assert ours["PodSecurityPolicy"]["spec"]["allowPrivilegeEscalation"] is False
        assert ours["Role"]["rules"][0]["resourceNames"] == ["linkerd-cni-cni"]
        assert ours["RoleBinding"]["subjects"] == [
            {"kind": "ServiceAccount", "name": "linkerd-cni", "namespace": "cni"}
        ]
        assert "PodSecurityPolicy" not in objects(render(tmp=tmp_path))

    @pytest.mark.parametrize(
        "image",
        [
            {"name": "cr.l5d.io/linkerd/cni-plugin", "version": "v1.7.0-alpha.1"},
            {"name": "mirror.example/linkerd/cni-plugin", "version": "edge"},
            {"version": "v1.6.8"},
        ],
    )
    def test_linkerd_image_is_translated(self, image: dict[str, str], tmp_path: Path) -> None:
        """Linkerd's image or tag from a copied values file would run cnibox's commands in an
        image without them: every container gets cnibox's image (NOTES.txt says so; the pinned
        helm renders notes only against a cluster, so they are not checked here)."""
        values = {"image": image, "repairController": {"enabled": True}}
        pod = pods(objects(render(values, tmp=tmp_path)))["linkerd-cni"]
        wanted = f"ghcr.io/cnibox/cnibox-installer:{__version__}"
        assert {c["image"] for c in pod["containers"]} == {wanted}

    def test_null_resources_render_as_in_linkerd(self, tmp_path: Path) -> None:
        """`resources: null` (both) renders no resources, as Linkerd's chart (it crashed)."""
        values = {"resources": None, "repairController": {"enabled": True, "resources": None}}
        pod = objects(render(values, tmp=tmp_path))["DaemonSet"]["spec"]["template"]["spec"]
        assert all("resources" not in c for c in pod["containers"])
        upstream = objects(render_upstream(values, tmp_path))["DaemonSet"]
        assert all(
            "resources" not in c for c in pods({"DaemonSet": upstream})["linkerd-cni"]["containers"]
        )

    @pytest.mark.parametrize(
        ("values", "where", "expected"),
        [
            ({"privileged": "true"}, "privileged", True),
            ({"privileged": "false"}, "privileged", False),
            ({"disableIPv6": "false"}, "ipv6", True),
            ({"repairController": {"enabled": "true"}}, "repair", True),
            ({"repairController": {"enabled": "false"}}, "repair", False),
            ({"enablePSP": "true"}, "psp", True),
            ({"revisionHistoryLimit": "3"}, "history", 3),
        ],
    )
    def test_quoted_booleans_and_numbers(
        self, values: dict[str, Any], where: str, expected: Any, tmp_path: Path
    ) -> None:
        """Quoted forms Linkerd's chart accepts are accepted; "false" means false."""
        ours = objects(render(values, tmp=tmp_path))
        pod = ours["DaemonSet"]["spec"]["template"]["spec"]
        containers = {c["name"]: c for c in pod["containers"]}
        config = json.loads(ours["ConfigMap"]["data"]["cni_network_config"])["linkerd"]
        found: dict[str, Any] = {
            "privileged": containers["install-cni"]["securityContext"]["privileged"],
            "ipv6": config["ipv6"],
            "repair": "repair-controller" in containers,
            "psp": "PodSecurityPolicy" in ours,
            "history": ours["DaemonSet"]["spec"]["revisionHistoryLimit"],
        }
        assert found[where] == expected

    @pytest.mark.parametrize(
        ("values", "message"),
        [
            ({"inboundProxyPrt": 4143}, "Additional property inboundProxyPrt is not allowed"),
            (
                {"repairController": {"enable": True}},
                "repairController: Additional property enable",
            ),
            ({"image": {"tag": "v1"}}, "image: Additional property tag is not allowed"),
            ({"resources": {"cpu": {"limits": "1"}}}, "resources.cpu: Additional property limits"),
            ({"agent": {"enable": True}}, "agent: Additional property enable"),
        ],
    )
    def test_unknown_keys_are_refused_by_name(
        self, values: dict[str, Any], message: str, tmp_path: Path
    ) -> None:
        """A typo fails the render naming the key and where it is (Linkerd's chart ignores it)."""
        with pytest.raises(manifests.RenderError, match=re.escape(message)):
            render(values, tmp=tmp_path)

    @pytest.mark.parametrize(
        ("values", "message"),
        [
            ({"iptablesMode": "iptables"}, "iptablesMode"),
            ({"inboundProxyPort": "4143x"}, "inboundProxyPort"),
            ({"portsToRedirect": "80;443"}, "portsToRedirect"),
            ({"destCNINetDir": "etc/cni"}, "destCNINetDir"),
            ({"disableIPv6": "yes"}, "disableIPv6"),
            ({"agent": {"logFormat": "xml"}}, "agent.logFormat"),
            ({"agent": {"adminAddress": "localhost"}}, "agent.adminAddress"),
            ({"logLevel": 'info", "x": "y'}, "logLevel"),
        ],
    )
    def test_bad_values_fail_naming_the_key(
        self, values: dict[str, Any], message: str, tmp_path: Path
    ) -> None:
        """A value that would break the CNI config on every node fails the render instead."""
        with pytest.raises(manifests.RenderError, match=re.escape(message)):
            render(values, tmp=tmp_path)


# --- what the cluster would accept, and what the containers run --------------------------------

ALL_FEATURES = {
    "installNamespace": True,
    "cacheDir": "/var/lib/cnibox",
    "talos": {"extension": True},
    "agent": {"enabled": True},
    "repairController": {"enabled": True},
    "resources": {"cpu": {"limit": "1"}},
}


# cnibox's node readiness gate with its admission policy (kinds Kubernetes 1.30+ serves)
GATE = {"agent": {"enabled": True}, "nodeReadinessGate": {"enabled": True, "admissionPolicy": True}}


def exec_argvs(pod: Mapping[str, Any]) -> Iterator[tuple[str, list[str]]]:
    """Every argv a container of the pod would exec: its command+args, hooks and probes."""
    for container in [*pod.get("initContainers", []), *pod["containers"]]:
        name = container["name"]
        if "command" in container or "args" in container:
            # args without a command go to the image's entrypoint (`cnibox install-cni`)
            command = container.get("command", IMAGE_LAYOUT["entrypoint"])
            yield name, [*command, *container.get("args", [])]
        for hook in container.get("lifecycle", {}).values():
            if "exec" in hook:
                yield name, hook["exec"]["command"]
        for probe in ("livenessProbe", "readinessProbe", "startupProbe"):
            if "exec" in container.get(probe, {}):
                yield name, container[probe]["exec"]["command"]


@pytest.fixture(scope="module")
def distinct_objects(tmp_path_factory: pytest.TempPathFactory) -> list[dict[str, Any]]:
    """Every object rendered with the defaults, all features, and each golden's values, once."""
    tmp = tmp_path_factory.mktemp("values")
    seen: dict[str, dict[str, Any]] = {}
    for values in [{}, ALL_FEATURES, *(v for _, v in GOLDEN_VALUES.values())]:
        for doc in objects(render(values, tmp=tmp)).values():
            seen.setdefault(json.dumps(doc, sort_keys=True), doc)
    return list(seen.values())


class TestRendering:
    def test_lint(self, tmp_path: Path) -> None:
        """helm lint --strict with the defaults, every cnibox feature, and every golden's values."""
        for values in [{}, ALL_FEATURES, GATE, *(v for _, v in GOLDEN_VALUES.values())]:
            path = tmp_path / "values.yaml"
            path.write_text(yaml.safe_dump(values))
            with tempfile.TemporaryDirectory() as home:
                proc = subprocess.run(
                    [pinned_helm(), "lint", "--strict", str(CHART), "--values", str(path)],
                    capture_output=True,
                    text=True,
                    check=False,
                    env=manifests.helm_environment(home),
                )
            assert proc.returncode == 0, proc.stdout + proc.stderr
            assert "0 chart(s) failed" in proc.stdout

    @pytest.mark.parametrize("version", ["1.25.0", "1.37.0"])
    def test_objects_pass_the_kubernetes_schemas(
        self, version: str, distinct_objects: list[dict[str, Any]]
    ) -> None:
        """Strict OpenAPI-derived schemas of the oldest and newest Kubernetes shipped offline."""
        import kubernetes_validate

        for doc in distinct_objects:
            try:
                kubernetes_validate.validate(doc, version, strict=True)
            except kubernetes_validate.ValidationError as exc:
                pytest.fail(f"{doc['kind']}: {exc.message} at {list(exc.path)}")

    def test_schema_validation_catches_a_bad_field(self) -> None:
        """The validator used above does reject a wrong type and an unknown field."""
        import kubernetes_validate

        ds = objects(manifests.render(pinned_helm(), "linkerd-cni.yaml"))["DaemonSet"]
        broken = copy.deepcopy(ds)
        broken["spec"]["template"]["spec"]["containers"][0]["securityContext"]["privileged"] = "no"
        with pytest.raises(kubernetes_validate.ValidationError):
            kubernetes_validate.validate(broken, "1.37.0", strict=True)
        broken = copy.deepcopy(ds)
        broken["spec"]["template"]["spec"]["hostNetworking"] = True
        with pytest.raises(kubernetes_validate.ValidationError):
            kubernetes_validate.validate(broken, "1.37.0", strict=True)

    @pytest.mark.parametrize("values", [{}, ALL_FEATURES], ids=["defaults", "all-features"])
    def test_no_shell_anywhere(self, values: dict[str, Any], tmp_path: Path) -> None:
        """Every command, hook and exec probe runs the image's cnibox with a known applet:
        `cnibox APPLET …` or the applet's link in the image (`/usr/local/bin/APPLET …`)."""
        every = pods(objects(render(values, tmp=tmp_path)))
        for pod in every.values():
            argvs = list(exec_argvs(pod))
            assert argvs, "nothing to check"
            for container, argv in argvs:
                words = {os.path.basename(word) for word in argv}
                assert not words & SHELLS, (container, argv)
                if argv[0] == INSTALLER:
                    applet = argv[1]
                else:
                    assert os.path.dirname(argv[0]) == APPLET_LINKS, (container, argv)
                    applet = os.path.basename(argv[0])
                assert applet in APPLET_NAMES, (container, argv)
            assert {c for c, _ in argvs} == {c["name"] for c in pod["containers"]}
        containers = {name: {c["name"] for c in pod["containers"]} for name, pod in every.items()}
        if values:  # the Talos extension's service is the agent: no DaemonSet for it
            assert containers == {"linkerd-cni": {"install-cni", "repair-controller"}}
        else:
            assert containers == {"linkerd-cni": {"install-cni"}, "linkerd-cni-agent": {"agent"}}

    @pytest.mark.parametrize(
        "values",
        [{}, ALL_FEATURES, {"repairController": {"enabled": True}}],
        ids=["defaults", "all-features", "repair-controller"],
    )
    def test_every_container_can_unpack_the_single_file(
        self, values: dict[str, Any], tmp_path: Path
    ) -> None:
        """The launcher unpacks its payload on start into $CNIBOX_CACHE or, without it, a
        /tmp/cnibox its uid owns (build/launcher.c): with a read-only root filesystem that
        needs a mounted directory, and containers that share one must run as the same user."""
        image = f"ghcr.io/cnibox/cnibox-installer:{__version__}"
        users: dict[str, set[int]] = {}  # host path or emptyDir -> uids unpacking there
        for name, pod in pods(objects(render(values, tmp=tmp_path))).items():
            volumes = {v["name"]: v for v in pod["volumes"]}
            for container in pod["containers"]:
                assert container["image"] == image
                context = container.get("securityContext", {})
                env = {e["name"]: e.get("value") for e in container.get("env", [])}
                mounts = {m["mountPath"]: m["name"] for m in container.get("volumeMounts", [])}
                where = env.get("CNIBOX_CACHE") or "/tmp"
                if context.get("readOnlyRootFilesystem"):
                    assert where in mounts, (container["name"], where)
                if where in mounts:
                    volume = volumes[mounts[where]]
                    key = (
                        volume["hostPath"]["path"]
                        if "hostPath" in volume
                        else f"{name}/{mounts[where]}"
                    )
                    users.setdefault(key, set()).add(context.get("runAsUser", 0))
        assert all(len(uids) == 1 for uids in users.values()), users

    def test_cnibox_features(self, tmp_path: Path) -> None:
        """Talos extension mount and shared cache dir on install-cni."""
        ours = objects(render(ALL_FEATURES, namespace="linkerd-cni", tmp=tmp_path))
        assert ours["Namespace"]["metadata"]["labels"]["pod-security.kubernetes.io/enforce"] == (
            "privileged"
        )
        pod = ours["DaemonSet"]["spec"]["template"]["spec"]
        containers = {c["name"]: c for c in pod["containers"]}
        volumes = {v["name"]: v for v in pod["volumes"]}
        install = containers["install-cni"]
        env = {e["name"]: e.get("value") for e in install["env"]}
        assert env["CNIBOX_HOST_BINARY"] == "/usr/local/lib/cnibox/cnibox"
        assert env["CNIBOX_CACHE"] == "/var/lib/cnibox"
        mounts = {m["name"]: m for m in install["volumeMounts"]}
        assert mounts["cnibox-extension"] == {
            "mountPath": "/host/usr/local/lib",
            "name": "cnibox-extension",
            "readOnly": True,
        }
        assert volumes["cnibox-extension"]["hostPath"] == {"path": "/usr/local/lib"}
        assert mounts["cnibox-cache"]["mountPath"] == "/var/lib/cnibox"
        assert volumes["cnibox-cache"]["hostPath"] == {"path": "/var/lib/cnibox"}
        assert AGENT not in ours  # the extension's service is the node's agent
        assert env["CNIBOX_HOST_CACHE"] == "/host/var/lib/cnibox"  # it serves that one too
        assert install["image"] == containers["repair-controller"]["image"]
        assert install["image"] == f"ghcr.io/cnibox/cnibox-installer:{__version__}"

    @pytest.mark.parametrize(
        ("mode", "capabilities"),
        [("nft", ["NET_ADMIN"]), ("nftables", ["NET_ADMIN"]),
         ("legacy", ["NET_ADMIN"]), ("plain", ["NET_ADMIN"])],
    )  # fmt: skip
    def test_the_agent_daemonset(self, mode: str, capabilities: list[str], tmp_path: Path) -> None:
        """agent.enabled: a DaemonSet of its own in the node's network namespace (the plugin's),
        root with CAP_NET_ADMIN, nothing else, in every mode (no CAP_SYS_ADMIN for legacy and
        plain: the agent hands those back, as `make test-agent`'s chart runs measure); the
        socket directory and the node's launcher cache from the host; probes on the admin port;
        a grace period longer than its own. install-cni keeps Linkerd's networking and gains the
        install-time unpack into the node's cache. (Without its keeper: test_the_agents_keeper
        adds what that needs.)"""
        values = {"agent": {"enabled": True, "keeper": "off"}, "iptablesMode": mode}
        ours = objects(render(values, tmp=tmp_path))
        ds = ours[AGENT]
        assert ds["metadata"]["labels"]["linkerd.io/cni-resource"] == "true"
        assert ds["spec"]["selector"] == {"matchLabels": {"k8s-app": "linkerd-cni-agent"}}
        pod = ds["spec"]["template"]["spec"]
        assert pod["hostNetwork"] is True
        assert pod["dnsPolicy"] == "ClusterFirstWithHostNet"
        assert pod["automountServiceAccountToken"] is True  # the pod cache's identity
        assert pod["terminationGracePeriodSeconds"] > 25  # the agent's --shutdown-grace
        [agent] = pod["containers"]
        assert agent["command"] == [INSTALLER, "agent"]
        assert agent["args"] == [
            "--socket",
            "/var/run/linkerd-cni/agent.sock",
            "--admin-addr",
            "127.0.0.1:9991",
            "--log-level",
            "info",
            "--log-format",
            "plain",
            "--keeper",
            "off",
        ]
        # Loopback (issue 24 #5), so the probes name it: the kubelet would ask the node's IP.
        assert agent["livenessProbe"]["httpGet"] == {
            "host": "127.0.0.1",
            "path": "/healthz",
            "port": "agent-admin",
        }
        assert agent["readinessProbe"]["httpGet"] == {
            "host": "127.0.0.1",
            "path": "/readyz",
            "port": "agent-admin",
        }
        assert agent["ports"] == [{"containerPort": 9991, "name": "agent-admin"}]
        assert agent["securityContext"] == {
            "runAsUser": 0,
            "readOnlyRootFilesystem": True,
            "allowPrivilegeEscalation": False,
            "privileged": False,
            "capabilities": {"drop": ["ALL"], "add": capabilities},
            "seccompProfile": {"type": "RuntimeDefault"},
        }
        volumes = {v["name"]: v["hostPath"] for v in pod["volumes"]}
        mounts = {m["mountPath"]: volumes[m["name"]] for m in agent["volumeMounts"]}
        assert mounts == {
            "/var/run/linkerd-cni": {"path": "/var/run/linkerd-cni", "type": "DirectoryOrCreate"},
            "/var/lib/cnibox": {"path": "/var/lib/cnibox"},
        }
        assert {e["name"]: e.get("value", e.get("valueFrom")) for e in agent["env"]} == {
            "CNIBOX_CACHE": "/var/lib/cnibox",
            "NODE_NAME": {"fieldRef": {"fieldPath": "spec.nodeName"}},  # the pod cache's node
        }

        installer_pod = ours["DaemonSet"]["spec"]["template"]["spec"]
        assert "hostNetwork" not in installer_pod
        assert [c["name"] for c in installer_pod["containers"]] == ["install-cni"]
        install = installer_pod["containers"][0]
        env = {e["name"]: e.get("value") for e in install["env"]}
        assert env["CNIBOX_HOST_CACHE"] == "/host/var/lib/cnibox"
        volumes = {v["name"]: v for v in installer_pod["volumes"]}
        [cache] = [m for m in install["volumeMounts"] if m["mountPath"] == "/host/var/lib/cnibox"]
        assert volumes[cache["name"]]["hostPath"] == {"path": "/var/lib/cnibox"}

    @pytest.mark.parametrize(
        ("mode", "keeper", "cache"),
        [("nft", "repair", "/var/lib/cni"), ("legacy", "report", ""), ("plain", "repair", "")],
    )
    def test_the_agents_keeper(self, mode: str, keeper: str, cache: str, tmp_path: Path) -> None:
        """agent.keeper (repair by default): the flags, CAP_SYS_ADMIN (a netlink socket in
        each pod's netns, the repair's ADD there), the node's CNI config, netns and CNI cache
        dirs read-only at their own paths (the netns with HostToContainer propagation), the
        node's xtables lock for x_tables; the agent's account (linkerd-cni, token mounted for
        its pod cache) may create events.k8s.io Events besides what upstream's role gives."""
        values: dict[str, Any] = {"agent": {"enabled": True}, "iptablesMode": mode}
        if keeper != "repair":
            values["agent"]["keeper"] = keeper
        if cache != "/var/lib/cni":
            values["agent"]["cniCacheDir"] = cache
        ours = objects(render(values, tmp=tmp_path))
        pod = ours[AGENT]["spec"]["template"]["spec"]
        [agent] = pod["containers"]
        flags = agent["args"][agent["args"].index("--keeper") :]
        assert flags == ["--keeper", keeper, "--cni-net-dir", "/etc/cni/net.d",
                         *(["--cni-cache-dir", cache] if cache else [])]  # fmt: skip
        assert agent["securityContext"]["capabilities"]["add"] == ["NET_ADMIN", "SYS_ADMIN"]
        volumes = {v["name"]: v["hostPath"] for v in pod["volumes"]}
        mounts = {m["mountPath"]: (m, volumes[m["name"]]) for m in agent["volumeMounts"]}
        expected = {
            "/etc/cni/net.d": {"path": "/etc/cni/net.d"},
            "/var/run/netns": {"path": "/var/run/netns"},
        }
        if cache:
            expected[cache] = {"path": cache}
        if mode != "nft":
            expected["/run/xtables.lock"] = {"path": "/run/xtables.lock", "type": "FileOrCreate"}
        keepers = {
            k: v for k, v in mounts.items() if k not in ("/var/run/linkerd-cni", "/var/lib/cnibox")
        }
        assert {k: host for k, (_m, host) in keepers.items()} == expected
        for path, (mount, _host) in keepers.items():
            assert mount.get("readOnly") is (None if path == "/run/xtables.lock" else True)
        assert mounts["/var/run/netns"][0]["mountPropagation"] == "HostToContainer"
        assert pod["serviceAccountName"] == "linkerd-cni"
        assert pod["automountServiceAccountToken"] is True
        events = {"apiGroups": ["events.k8s.io"], "resources": ["events"], "verbs": ["create"]}
        rules = ours["ClusterRole"]["rules"]
        assert events in rules
        off = {"agent": {"enabled": True, "keeper": "off"}}
        assert rules == [*objects(render(off, tmp=tmp_path))["ClusterRole"]["rules"], events]

    def test_keeper_off_grants_no_events_and_mounts_nothing(self, tmp_path: Path) -> None:
        ours = objects(render({"agent": {"enabled": True, "keeper": "off"}}, tmp=tmp_path))
        assert not [r for r in ours["ClusterRole"]["rules"] if "events" in r["resources"]]
        [agent] = ours[AGENT]["spec"]["template"]["spec"]["containers"]
        assert "/var/run/netns" not in {m["mountPath"] for m in agent["volumeMounts"]}
        with pytest.raises(manifests.RenderError, match="keeper"):
            render({"agent": {"enabled": True, "keeper": "fix"}}, tmp=tmp_path)

    @pytest.mark.parametrize(
        ("address", "listen", "host"),
        [
            ("::1", "[::1]:9991", "::1"),
            ("0.0.0.0", "0.0.0.0:9991", None),
            ("::", "[::]:9991", None),
        ],
    )
    def test_the_agents_admin_address(
        self, address: str, listen: str, host: str | None, tmp_path: Path
    ) -> None:
        """agent.adminAddress: the agent listens there and its probes ask there; on every
        address (a wildcard) the probes ask the kubelet's default, the node's IP."""
        values = {"agent": {"enabled": True, "adminAddress": address}}
        [agent] = objects(render(values, tmp=tmp_path))[AGENT]["spec"]["template"]["spec"][
            "containers"
        ]
        assert agent["args"][agent["args"].index("--admin-addr") + 1] == listen
        for probe in ("livenessProbe", "readinessProbe"):
            assert agent[probe]["httpGet"].get("host") == host

    def test_the_agent_is_on_by_default(self, tmp_path: Path) -> None:
        """Issue 24: the defaults run the agent (its DaemonSet, install-cni's unpack into the
        node's cache), as `agent.enabled=true` does; the committed plain manifest too."""
        defaults = objects(render(tmp=tmp_path))
        assert defaults == objects(render({"agent": {"enabled": True}}, tmp=tmp_path))
        assert AGENT in defaults
        install = defaults["DaemonSet"]["spec"]["template"]["spec"]["containers"][0]
        assert "CNIBOX_HOST_CACHE" in {e["name"] for e in install["env"]}
        assert AGENT in objects(manifests.render(pinned_helm(), "linkerd-cni.yaml"))
        # The launcher on the node looks at its default path (a runtime sets no
        # CNIBOX_AGENT_SOCKET): the DaemonSet's and the Talos service's socket are that one.
        launcher = (REPO / "build" / "agent_client.c").read_text()
        [default] = re.findall(r'#define AGENT_DEFAULT_SOCKET "([^"]+)"', launcher)
        [agent] = defaults[AGENT]["spec"]["template"]["spec"]["containers"]
        assert agent["args"][agent["args"].index("--socket") + 1] == default
        service = yaml.safe_load((REPO / "packaging" / "talos" / "cnibox-agent.yaml").read_text())
        args = service["container"]["args"]
        assert args[args.index("--socket") + 1] == default

    def test_nothing_of_the_agent_when_disabled(self, tmp_path: Path) -> None:
        """agent.enabled=false: no DaemonSet, install-cni as Linkerd's (no CNIBOX_HOST_CACHE,
        no host cache mount), no PSP allowance: the one-shot plugin alone."""
        text = render({"agent": {"enabled": False}, "enablePSP": True}, tmp=tmp_path)
        ours = objects(text)
        assert AGENT not in ours
        assert "linkerd-cni-agent" not in text
        pod = ours["DaemonSet"]["spec"]["template"]["spec"]
        install = pod["containers"][0]
        assert "CNIBOX_HOST_CACHE" not in {e["name"] for e in install["env"]}
        assert "cnibox-host-cache" not in {v["name"] for v in pod["volumes"]}
        assert "hostNetwork" not in ours["PodSecurityPolicy"]["spec"]

    def test_talos_extension_runs_no_agent_daemonset(self, tmp_path: Path) -> None:
        """With the extension its service ext-cnibox-agent is the node's agent (same socket,
        same admin port): the chart adds no second one, by default or when asked."""
        for agent in ({}, {"agent": {"enabled": True}}):
            ours = objects(render({"talos": {"extension": True}, **agent}, tmp=tmp_path))
            assert AGENT not in ours
            install = ours["DaemonSet"]["spec"]["template"]["spec"]["containers"][0]
            assert "CNIBOX_HOST_CACHE" in {e["name"] for e in install["env"]}
        assert AGENT not in objects(manifests.render(pinned_helm(), "linkerd-cni-talos.yaml"))

    def test_psp_admits_the_agent(self, tmp_path: Path) -> None:
        """enablePSP with the agent: the policy allows what the agent's pod asks for."""
        ours = objects(render({"enablePSP": True, "agent": {"enabled": True}}, tmp=tmp_path))
        spec = ours["PodSecurityPolicy"]["spec"]
        assert spec["hostNetwork"] is True
        assert spec["hostPorts"] == [{"min": 9991, "max": 9991}]
        assert spec["allowedCapabilities"] == ["NET_ADMIN", "SYS_ADMIN"]  # the keeper's
        keeperless = {"enablePSP": True, "agent": {"enabled": True, "keeper": "off"}}
        spec = objects(render(keeperless, tmp=tmp_path))["PodSecurityPolicy"]["spec"]
        assert spec["allowedCapabilities"] == ["NET_ADMIN"]
        assert ours[AGENT]["spec"]["template"]["spec"]["serviceAccountName"] == "linkerd-cni"

    def test_committed_manifests_are_the_chart_rendering(self) -> None:
        """packaging/kubernetes/*.yaml are exactly `helm template` of the chart today."""
        proc = subprocess.run(
            [
                sys.executable,
                str(REPO / "packaging" / "helm" / "manifests.py"),
                "--check",
                "--helm",
                pinned_helm(),
            ],
            capture_output=True,
            text=True,
            check=False,
        )
        assert proc.returncode == 0, proc.stderr


class TestNodeReadinessGate:
    """nodeReadinessGate (docs/node-readiness.md): off changes nothing; on adds the
    installer's env, the patch rule and, when asked, the admission policy (1.30+)."""

    def test_off_renders_no_gate(self, tmp_path: Path) -> None:
        text = render({"agent": {"enabled": True}}, tmp=tmp_path)
        assert "CNIBOX_GATE" not in text
        assert "nodes/status" not in text
        assert "ValidatingAdmissionPolicy" not in text
        rules = objects(text)["ClusterRole"]["rules"]
        assert all("patch" not in r["verbs"] for r in rules)

    def test_on_adds_env_rule_and_policy(self, tmp_path: Path) -> None:
        docs = objects(render(GATE, tmp=tmp_path))
        container = docs["DaemonSet"]["spec"]["template"]["spec"]["containers"][0]
        env = {e["name"]: e.get("value", e.get("valueFrom")) for e in container["env"]}
        assert env["CNIBOX_GATE"] == "true"
        assert env["NODE_NAME"] == {"fieldRef": {"fieldPath": "spec.nodeName"}}
        assert env["CNIBOX_GATE_TAINT_KEY"] == "linkerd-cni.cnibox.io/not-ready"
        assert env["CNIBOX_GATE_AGENT_SOCKET"] == "/var/run/linkerd-cni/agent.sock"
        mounts = {m["mountPath"] for m in container["volumeMounts"]}
        assert "/var/run/linkerd-cni" in mounts
        patch_rules = [r for r in docs["ClusterRole"]["rules"] if "patch" in r["verbs"]]
        assert patch_rules == [
            {"apiGroups": [""], "resources": ["nodes", "nodes/status"], "verbs": ["patch"]}
        ]
        policy = docs["ValidatingAdmissionPolicy"]
        assert "linkerd-test:linkerd-cni" in policy["spec"]["matchConditions"][0]["expression"]
        node_name = policy["spec"]["variables"][0]["expression"]
        assert "authentication.kubernetes.io/node-name" in node_name
        binding = docs["ValidatingAdmissionPolicyBinding"]
        assert binding["spec"]["policyName"] == policy["metadata"]["name"]

    def test_policy_only_when_asked(self, tmp_path: Path) -> None:
        values = {"nodeReadinessGate": {"enabled": True}}
        assert "ValidatingAdmissionPolicy" not in render(values, tmp=tmp_path)

    @pytest.mark.parametrize("version", ["1.25.0", "1.30.0", "1.37.0"])
    def test_objects_pass_the_kubernetes_schemas(self, version: str, tmp_path: Path) -> None:
        """Everything with the gate on against the same schemas as the rest; the policy
        against the versions it names (admissionregistration.k8s.io/v1: 1.30+), and a
        version before that has no such schema."""
        import kubernetes_validate

        for doc in objects(render(GATE, tmp=tmp_path)).values():
            policy = doc["kind"].startswith("ValidatingAdmissionPolicy")
            if policy and version < "1.30.0":
                with pytest.raises(kubernetes_validate.utils.SchemaNotFoundError):
                    kubernetes_validate.validate(doc, "1.29.0", strict=True)
                continue
            kubernetes_validate.validate(doc, version, strict=True)

    @pytest.mark.parametrize(
        ("values", "key"),
        [
            ({"taintEffect": "Sometimes"}, "taintEffect"),
            ({"taintKey": "not a key"}, "taintKey"),
            ({"interval": 0}, "interval"),
            ({"surprise": True}, "surprise"),
        ],
    )
    def test_bad_gate_values_fail(self, values: dict[str, Any], key: str, tmp_path: Path) -> None:
        with pytest.raises(manifests.RenderError, match=key):
            render({"nodeReadinessGate": {"enabled": True, **values}}, tmp=tmp_path)


# The kubelet's own mounts on Talos (siderolabs/talos ad88231,
# internal/app/machined/pkg/system/services/kubelet.go `Runner`): destination in the kubelet's
# mount namespace -> (source on the node, read-write). docs/talos.md "Host paths" lists them.
TALOS_KUBELET_MOUNTS: dict[str, tuple[str, bool]] = {
    "/dev": ("/dev", True),
    "/sys": ("/sys", False),
    "/sys/fs/cgroup": ("/sys/fs/cgroup", True),
    "/lib/modules": ("/usr/lib/modules", False),
    "/etc/kubernetes": ("/etc/kubernetes", True),
    "/usr/local/lib/kubelet/credentialproviders": (
        "/usr/local/lib/kubelet/credentialproviders",
        False,
    ),
    "/etc/nfsmount.conf": ("/etc/nfsmount.conf", False),
    "/etc/machine-id": ("/etc/machine-id", False),
    "/etc/os-release": ("/etc/os-release", False),
    "/system/resolved/resolv.conf": ("/system/resolved/resolv.conf", False),
    "/etc/cni": ("/etc/cni", False),
    "/var/run": ("/run", True),  # the node's /var/run is a symlink to /run
    "/var/lib/containerd": ("/var/lib/containerd", True),
    "/var/lib/kubelet": ("/var/lib/kubelet", True),
    "/var/log/containers": ("/var/log/containers", True),
    "/var/log/pods": ("/var/log/pods", True),
    "/var/mnt": ("/var/mnt", False),
}
# hostPath types the kubelet checks (or creates) in its own mount namespace before the
# runtime mounts the node's path; an untyped one it leaves to the runtime (which creates a
# missing directory on the node).
KUBELET_CHECKED = {"Directory", "File", "Socket", "CharDevice", "BlockDevice"}
KUBELET_CREATES = {"DirectoryOrCreate", "FileOrCreate"}
TALOS_ROUTES: dict[str, dict[str, Any]] = {
    "A": {},
    "A+agent+gate": {"agent": {"enabled": True}, "nodeReadinessGate": {"enabled": True}},
    "B": {"talos": {"extension": True}},
    "B+cache+gate": {
        "talos": {"extension": True},
        "cacheDir": "/var/lib/cnibox",
        "nodeReadinessGate": {"enabled": True},
        "repairController": {"enabled": True},
    },
    "C": {"talos": {"extension": True}, "agent": {"enabled": False}},
}


def kubelet_view(path: str) -> tuple[str, bool] | None:
    """The kubelet mount `path` lies in on Talos (its node path, writable), or None."""
    for destination, (source, writable) in TALOS_KUBELET_MOUNTS.items():
        if path == destination or path.startswith(destination.rstrip("/") + "/"):
            return source + path[len(destination) :], writable
    return None


class TestTalosRoute:
    """Issue 27 item 1: every hostPath of the Talos routes' objects works with a kubelet that
    runs in its own mount namespace (Talos): a typed one must lie in one of the kubelet's
    mounts (writable when the kubelet is to create it), else it carries no type."""

    @pytest.mark.parametrize("route", sorted(TALOS_ROUTES))
    def test_every_host_path_against_the_kubelets_mounts(self, route: str, tmp_path: Path) -> None:
        ours = objects(render(TALOS_ROUTES[route], tmp=tmp_path))
        seen = 0
        for name, pod in pods(ours).items():
            for volume in pod.get("volumes", []):
                host_path = volume.get("hostPath")
                if host_path is None:
                    continue
                seen += 1
                kind = host_path.get("type", "")
                where = f"{name}: volume {volume['name']} ({host_path['path']}, type {kind!r})"
                if kind in KUBELET_CHECKED | KUBELET_CREATES:
                    view = kubelet_view(host_path["path"])
                    assert view is not None, f"{where}: the kubelet on Talos cannot see it"
                    assert kind not in KUBELET_CREATES or view[1], f"{where}: read-only there"
                else:
                    assert kind == "", where
        assert seen >= 2  # at least the CNI bin and config dirs

    def test_the_extension_mount_is_a_directory_every_talos_node_has(self, tmp_path: Path) -> None:
        """The extension's directory's parent, read-only: /usr/local/lib, which Talos' rootfs
        always holds (its Dockerfile makes /usr/local/lib/kubelet/credentialproviders, the
        kubelet mounts it), so a node without the extension starts the pod and install-cni
        names what is missing (tests/pure/test_install_cni.py)."""
        ours = objects(render({"talos": {"extension": True}}, tmp=tmp_path))
        pod = ours["DaemonSet"]["spec"]["template"]["spec"]
        volumes = {v["name"]: v for v in pod["volumes"]}
        assert volumes["cnibox-extension"]["hostPath"] == {"path": "/usr/local/lib"}
        assert kubelet_view("/usr/local/lib/kubelet/credentialproviders") is not None
        install = pod["containers"][0]
        env = {e["name"]: e.get("value") for e in install["env"]}
        mount = next(m for m in install["volumeMounts"] if m["name"] == "cnibox-extension")
        assert mount["readOnly"] is True
        assert env["CNIBOX_HOST_BINARY"].startswith(mount["mountPath"].removeprefix("/host"))

    def test_the_documented_mount_list_is_the_tested_one(self) -> None:
        text = (REPO / "docs" / "talos.md").read_text()
        for destination in TALOS_KUBELET_MOUNTS:
            assert f"`{destination}`" in text, destination

    def test_the_rule_catches_the_old_typed_extension_mount(self) -> None:
        """The check fails for what the chart rendered before: /usr/local/lib/cnibox of type
        Directory is outside every kubelet mount on Talos."""
        assert kubelet_view("/usr/local/lib/cnibox") is None
        assert kubelet_view("/var/lib/cnibox") is None
        assert kubelet_view("/var/run/linkerd-cni") == ("/run/linkerd-cni", True)


class TestInstallerProbeMetricsAnnotations:
    """Issue 27 item 7: what operators of Istio's chart expect, as far as it fits: a readiness
    probe, a metrics endpoint (loopback by default), podAnnotations; priorityClassName keeps
    Linkerd's default (empty) so a values file from Linkerd's chart renders the same pod."""

    def test_defaults(self, tmp_path: Path) -> None:
        pod = objects(render(tmp=tmp_path))["DaemonSet"]["spec"]["template"]["spec"]
        install = pod["containers"][0]
        assert install["args"] == ["--admin-addr", "127.0.0.1:9992"]
        assert install["readinessProbe"]["exec"]["command"] == [INSTALLER, "install-cni", "--ready"]
        assert "ports" not in install  # loopback: nothing to declare
        assert "priorityClassName" not in pod  # Linkerd's default, ""

    def test_a_wildcard_address_declares_the_port(self, tmp_path: Path) -> None:
        values = {"installer": {"adminAddress": "::", "adminPort": 9000, "readinessProbe": False}}
        pod = objects(render(values, tmp=tmp_path))["DaemonSet"]["spec"]["template"]["spec"]
        install = pod["containers"][0]
        assert install["args"] == ["--admin-addr", "[::]:9000"]
        assert install["ports"] == [{"containerPort": 9000, "name": "install-admin"}]
        assert "readinessProbe" not in install

    def test_pod_annotations_on_both_daemonsets(self, tmp_path: Path) -> None:
        values = {
            "podAnnotations": {"prometheus.io/scrape": "true", "example.com/x": "some-value"},
            "agent": {"enabled": True},
            "priorityClassName": "system-node-critical",
        }
        ours = objects(render(values, tmp=tmp_path))
        for name in ("DaemonSet", AGENT):
            template = ours[name]["spec"]["template"]
            annotations = template["metadata"]["annotations"]
            assert annotations["prometheus.io/scrape"] == "true"
            assert annotations["example.com/x"] == "some-value"
            assert annotations["linkerd.io/inject"] == "disabled"  # the chart's own stay
            assert template["spec"]["priorityClassName"] == "system-node-critical"

    @pytest.mark.parametrize(
        ("values", "key"),
        [
            ({"installer": {"adminAddress": "localhost"}}, "adminAddress"),
            ({"installer": {"adminPort": 0}}, "adminPort"),
            ({"installer": {"readinesProbe": True}}, "readinesProbe"),
            ({"podAnnotations": {"a": 1}}, "podAnnotations"),
        ],
    )
    def test_bad_values_fail_naming_the_key(
        self, values: dict[str, Any], key: str, tmp_path: Path
    ) -> None:
        with pytest.raises(manifests.RenderError, match=re.escape(key)):
            render(values, tmp=tmp_path)

"""Which pods get rules and with which options (docs/upstream-behaviour.md §3), on upstream's
injected pod manifests and an annotation matrix: pod vs namespace, replace vs append, invalid
values."""

from __future__ import annotations

from typing import Any

import pytest

from multicall.core.firewall.model import ProxyInitOptions
from multicall.core.kube.objects import Pod, Service, ServicePort, parse_pod, parse_service
from multicall.core.kube.pod_policy import (
    decide,
    effective_options,
    needs_namespace,
    needs_service,
)
from multicall.errors import CniError, ConfigError
from tests.support import FIXTURES
from tests.support.kubeapi import pods_from_golden, service_doc

GOLDENS = FIXTURES / "upstream" / "linkerd2" / "inject-goldens"
BASE = ProxyInitOptions(
    incoming_proxy_port=4143,
    outgoing_proxy_port=4140,
    proxy_uid=2102,
    inbound_ports_to_ignore=("4191", "4190"),
    outbound_ports_to_ignore=("25",),
    subnets_to_ignore=("10.0.0.0/8",),
)


def golden(name: str) -> Pod:
    return parse_pod(pods_from_golden(GOLDENS / f"inject_emojivoto_deployment{name}.golden.yml")[0])


def pod(annotations: dict[str, str] | None = None, **kw: Any) -> Pod:
    return Pod("p", "ns", containers=("app", "linkerd-proxy"), annotations=annotations or {}, **kw)


class TestDecide:
    """meshed iff linkerd-proxy (container or native sidecar) and no linkerd-init."""

    @pytest.mark.parametrize(
        ("name", "meshed", "message"),
        [
            ("_no_init_container", True, "setting up iptables firewall for emojivoto/"),
            ("", False, "linkerd-init initContainer is present, skipping."),
            ("_native_sidecar", False, "linkerd-init initContainer is present, skipping."),
            ("_config_overrides", False, "linkerd-init initContainer is present, skipping."),
            ("_overridden_noinject", False, "linkerd-proxy is not present, skipping."),
        ],
    )
    def test_upstream_goldens(self, name: str, meshed: bool, message: str) -> None:
        decision = decide(golden(name))
        assert decision.meshed is meshed
        assert message in decision.message

    @pytest.mark.parametrize(
        ("containers", "inits", "meshed"),
        [
            (("app", "linkerd-proxy"), (), True),
            (("app",), ("linkerd-proxy",), True),
            (("app",), ("linkerd-network-validator", "linkerd-proxy"), True),
            (("app", "linkerd-proxy"), ("linkerd-init",), False),
            (("app", "linkerd-proxy-x"), (), False),
            (("linkerd-init",), (), False),
            ((), (), False),
        ],
    )
    def test_names_only(
        self, containers: tuple[str, ...], inits: tuple[str, ...], meshed: bool
    ) -> None:
        """Only exact container names count; annotations are never consulted."""
        p = Pod("p", "ns", containers, inits, {"linkerd.io/inject": "disabled"})
        assert decide(p).meshed is meshed


SKIP_OUT = "config.linkerd.io/skip-outbound-ports"
SKIP_IN = "config.linkerd.io/skip-inbound-ports"
SUBNETS = "config.linkerd.io/skip-subnets"
UID = "config.linkerd.io/proxy-uid"
GID = "config.linkerd.io/proxy-gid"


class TestOverrides:
    """Annotation overrides in upstream's order and semantics."""

    @pytest.mark.parametrize(
        ("pod_ann", "ns_ann", "field", "value"),
        [
            ({SKIP_OUT: "443,587"}, {}, "outbound_ports_to_ignore", ("443", "587")),
            ({}, {SKIP_OUT: "5432"}, "outbound_ports_to_ignore", ("5432",)),
            ({SKIP_OUT: "1"}, {SKIP_OUT: "2"}, "outbound_ports_to_ignore", ("1",)),
            ({SKIP_OUT: ""}, {SKIP_OUT: "2"}, "outbound_ports_to_ignore", ("2",)),
            ({SKIP_OUT: "25, 587"}, {}, "outbound_ports_to_ignore", ("25", " 587")),
            ({SKIP_IN: "7777,8888"}, {}, "inbound_ports_to_ignore",
             ("4191", "4190", "7777", "8888")),
            ({}, {SKIP_IN: "9000-9010"}, "inbound_ports_to_ignore", ("4191", "4190", "9000-9010")),
            ({SUBNETS: "192.168.0.0/16, 172.16.0.0/12"}, {}, "subnets_to_ignore",
             ("192.168.0.0/16", " 172.16.0.0/12")),
            ({}, {}, "subnets_to_ignore", ("10.0.0.0/8",)),
            ({UID: "1000"}, {}, "proxy_uid", 1000),
            ({}, {UID: "+7"}, "proxy_uid", 7),
            ({UID: "-1"}, {}, "proxy_uid", -1),
            ({GID: "2103"}, {}, "proxy_gid", 2103),
            ({}, {GID: "0"}, "proxy_gid", 0),
        ],
    )  # fmt: skip
    def test_matrix(
        self, pod_ann: dict[str, str], ns_ann: dict[str, str], field: str, value: object
    ) -> None:
        options = effective_options(BASE, pod(pod_ann), ns_ann)
        assert getattr(options, field) == value

    @pytest.mark.parametrize(
        ("value", "message"),
        [
            ("abc", 'strconv.Atoi: parsing "abc": invalid syntax'),
            (" 1000", 'strconv.Atoi: parsing " 1000": invalid syntax'),
            ("1_000", 'strconv.Atoi: parsing "1_000": invalid syntax'),
            ("٣", 'strconv.Atoi: parsing "٣": invalid syntax'),
            ("9" * 20, f'strconv.Atoi: parsing "{"9" * 20}": value out of range'),
        ],
    )  # fmt: skip
    @pytest.mark.parametrize("key", [UID, GID])
    def test_invalid_ids(self, key: str, value: str, message: str) -> None:
        """Go Atoi rules: no spaces, no underscores, ASCII digits; the error is the message."""
        with pytest.raises(CniError) as info:
            effective_options(BASE, pod({key: value}), {})
        assert (info.value.code, info.value.message) == (999, message)

    def test_order_uid_error_after_port_overrides(self) -> None:
        """A bad uid fails even when the namespace supplies every port override."""
        with pytest.raises(CniError):
            effective_options(BASE, pod(), {SKIP_OUT: "1", UID: "x"})

    def test_namespace_needed_only_for_missing_annotations(self) -> None:
        """The namespace is fetched (once) only when some override is absent on the pod."""
        full = {SKIP_OUT: "1", SKIP_IN: "2", SUBNETS: "10.0.0.0/8", UID: "1", GID: "1"}
        assert not needs_namespace(pod(full))
        assert needs_namespace(pod({**full, GID: ""}))
        assert needs_namespace(pod())


class TestControlPlane:
    """Control-plane pods skip the API server's ports."""

    def control_plane(self) -> Pod:
        return pod(labels={"linkerd.io/control-plane-component": "destination"})

    def test_service_ports_and_integer_target_ports(self) -> None:
        service = parse_service(service_doc([
            {"name": "https", "port": 443, "targetPort": 6443},
            {"name": "alt", "port": 8443, "targetPort": "https"},
        ]))  # fmt: skip
        options = effective_options(BASE, self.control_plane(), {SKIP_OUT: "9"}, service)
        assert options.outbound_ports_to_ignore == ("9", "443", "6443", "8443")

    def test_fallback_when_the_service_is_unreadable(self) -> None:
        options = effective_options(BASE, self.control_plane(), {}, None)
        assert options.outbound_ports_to_ignore == ("25", "443", "6443")

    def test_only_for_labelled_pods(self) -> None:
        assert needs_service(self.control_plane())
        assert not needs_service(pod(labels={"linkerd.io/control-plane-component": ""}))
        service = Service("kubernetes", "default", (ServicePort(443, 6443),))
        assert effective_options(BASE, pod(), {}, service) == BASE


class TestParsing:
    """Kubernetes JSON into values."""

    def test_bad_documents(self) -> None:
        with pytest.raises(ConfigError):
            parse_pod({"kind": "Namespace"})
        with pytest.raises(ConfigError):
            parse_pod({"metadata": {}, "spec": {"containers": "x"}})
        with pytest.raises(ConfigError):
            parse_service({"spec": {"ports": [{"port": "443"}]}})

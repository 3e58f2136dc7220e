"""The plugin's network config decoded as Go's encoding/json decodes upstream's PluginConf, and
Go's scanner errors (the CNI code-6 texts) for malformed input."""

from __future__ import annotations

import json

import pytest

from multicall.core.cni.netconf import (
    MODE_ERROR,
    NetConf,
    base_options,
    log_level,
    mode_of,
    parse_netconf,
)
from multicall.core.firewall.model import Mode
from multicall.core.go.encoding_json import scanner as gojson
from multicall.errors import CniError
from tests.support import FIXTURES

CHART = FIXTURES / "derived" / "linkerd-shell-installer" / "CNI_NETWORK_CONFIG.chart-default.json"


class TestNetConf:
    def test_chart_default(self) -> None:
        """The chart's network config yields its values; absent keys keep Go zero values."""
        conf = parse_netconf(CHART.read_bytes())
        assert (conf.incoming_proxy_port, conf.outgoing_proxy_port, conf.proxy_uid) == (
            4143, 4140, 2102,
        )  # fmt: skip
        assert conf.proxy_gid == 0
        assert conf.inbound_ports_to_ignore == ("4191", "4190")
        assert conf.outbound_ports_to_ignore == ()
        assert conf.kubeconfig == "__KUBECONFIG_FILEPATH__"
        assert mode_of(conf) is Mode.NFT
        assert log_level(conf) == "info"

    def test_absent_everything(self) -> None:
        """An empty object is upstream's zero config (ports 0, legacy mode, warn level)."""
        conf = parse_netconf(b"{}")
        assert conf == NetConf()
        assert mode_of(conf) is Mode.LEGACY
        assert log_level(conf) == "warn"
        options = base_options(conf)
        assert (options.incoming_proxy_port, options.proxy_uid) == (0, 0)

    def test_keys_fold_case_and_duplicates_merge(self) -> None:
        """Go matches keys case-insensitively; a repeated object merges, a list replaces."""
        conf = parse_netconf(
            b'{"LINKERD": {"Proxy-UID": 5, "inbound-ports-to-ignore": ["1"]},'
            b' "linkerd": {"IPv6": true, "INBOUND-PORTS-TO-IGNORE": ["2", "3"]},'
            b' "Log_Level": "DEBUG", "KUBERNETES": {"KubeConfig": "/k"}}'
        )
        assert (conf.proxy_uid, conf.ipv6) == (5, True)
        assert conf.inbound_ports_to_ignore == ("2", "3")
        assert (log_level(conf), conf.kubeconfig) == ("debug", "/k")

    def test_nulls(self) -> None:
        """null leaves scalars alone and empties lists."""
        conf = parse_netconf(b'{"linkerd": {"proxy-uid": 7}, "LINKERD": {"proxy-uid": null, '
                             b'"subnets-to-ignore": null, "ports-to-redirect": [80]}}')  # fmt: skip
        assert conf.proxy_uid == 7
        assert conf.subnets_to_ignore == ()
        assert conf.ports_to_redirect == (80,)

    @pytest.mark.parametrize(
        ("body", "error"),
        [
            ({"linkerd": {"proxy-uid": "2102"}},
             "cannot unmarshal string into Go struct field ProxyInit.linkerd.proxy-uid "
             "of type int"),
            ({"linkerd": {"inbound-ports-to-ignore": [4191]}},
             "cannot unmarshal number into Go struct field "
             "ProxyInit.linkerd.inbound-ports-to-ignore of type string"),
            ({"linkerd": {"ports-to-redirect": [8080.5]}},
             "cannot unmarshal number 8080.5 into Go struct field "
             "ProxyInit.linkerd.ports-to-redirect of type int"),
            ({"linkerd": {"ipv6": "false"}},
             "cannot unmarshal string into Go struct field ProxyInit.linkerd.ipv6 of type bool"),
            ({"linkerd": "x"},
             "cannot unmarshal string into Go struct field PluginConf.linkerd "
             "of type main.ProxyInit"),
            ({"kubernetes": {"kubeconfig": 1}},
             "cannot unmarshal number into Go struct field Kubernetes.kubernetes.kubeconfig "
             "of type string"),
            ({"prevResult": []},
             "cannot unmarshal array into Go struct field PluginConf.prevResult of type "
             "map[string]interface {}"),
            ({"linkerd": {"proxy-uid": "x", "proxy-gid": "y"}},
             "ProxyInit.linkerd.proxy-uid"),
        ],
    )  # fmt: skip
    def test_type_errors(self, body: dict[str, object], error: str) -> None:
        """The first type mismatch fails like upstream (code 999, Go's text)."""
        with pytest.raises(CniError) as info:
            parse_netconf(json.dumps(body).encode())
        assert info.value.code == 999
        assert info.value.message.startswith(
            "linkerd-cni: failed to parse network configuration: json: "
        )
        assert error in info.value.message

    @pytest.mark.parametrize("mode", ["NFT", "iptables", " nft"])
    def test_invalid_mode(self, mode: str) -> None:
        with pytest.raises(CniError, match=MODE_ERROR):
            mode_of(NetConf(iptables_mode=mode))


class TestGoScanner:
    """Go's checkValid texts, which skel prints for code 6."""

    @pytest.mark.parametrize(
        ("data", "message"),
        [
            (b"", "unexpected end of JSON input"),
            (b"   ", "unexpected end of JSON input"),
            (b"not json", "invalid character 'o' in literal null (expecting 'u')"),
            (b"{", "unexpected end of JSON input"),
            (b'{"a" 1}', "invalid character '1' after object key"),
            (b'{"a": 1 "b"}', "invalid character '\"' after object key:value pair"),
            (b"[1 2]", "invalid character '2' after array element"),
            (b"{1}", "invalid character '1' looking for beginning of object key string"),
            (b"[,]", "invalid character ',' looking for beginning of value"),
            (b'"\\q"', "invalid character 'q' in string escape code"),
            (b'"\\u12x4"', "invalid character 'x' in \\u hexadecimal character escape"),
            (b'"a\nb"', "invalid character '\\n' in string literal"),
            (b"01", "invalid character '1' after top-level value"),
            (b"-x", "invalid character 'x' in numeric literal"),
            (b"1.", "unexpected end of JSON input"),
            (b"1.x", "invalid character 'x' after decimal point in numeric literal"),
            (b"1ex", "invalid character 'x' in exponent of numeric literal"),
            (b"{}}", "invalid character '}' after top-level value"),
            (b"'a'", "invalid character '\\'' looking for beginning of value"),
            (b"\xef\xbb\xbf{}", "invalid character 'ï' looking for beginning of value"),
            (b"trUe", "invalid character 'U' in literal true (expecting 'u')"),
            (b"NaN", "invalid character 'N' looking for beginning of value"),
        ],
    )
    def test_messages(self, data: bytes, message: str) -> None:
        assert gojson.syntax_error(data) == message

    @pytest.mark.parametrize("data", [b"{}", b' [1, -0.5e+3, true, null, "\\u00e9"] ', b"0"])
    def test_valid(self, data: bytes) -> None:
        assert gojson.syntax_error(data) is None

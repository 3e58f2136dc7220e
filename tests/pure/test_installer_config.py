"""core.installer.config: variables, config sources and kubeconfig text, as upstream tests them."""

from __future__ import annotations

import json

import pytest

from multicall.core.installer.config import (
    DEFAULTS,
    SourceRead,
    choose_network_config,
    go_path_join,
    parse_environment,
    render_kubeconfig,
    source_names,
)
from multicall.errors import ConfigError
from tests.support import FIXTURES

TESTDATA = FIXTURES / "upstream" / "proxy-init" / "internal-cni-testdata"
TOKEN = (TESTDATA / "auth-token").read_bytes()


class TestEnvironment:
    def test_defaults(self) -> None:
        """Unset and empty variables give upstream's defaults."""
        config = parse_environment({"DEST_CNI_NET_DIR": ""})
        assert config.host_net_dir == "/host/etc/cni/net.d"
        assert config.host_bin_dir == "/host/opt/cni/bin"
        assert config.kubeconfig_path == "/host/etc/cni/net.d/ZZZ-linkerd-cni-kubeconfig"
        assert config.plugin_kubeconfig_path == "/etc/cni/net.d/ZZZ-linkerd-cni-kubeconfig"
        assert config.token_file == "/var/run/secrets/kubernetes.io/serviceaccount/token"
        assert config.ca_file == "/var/run/secrets/kubernetes.io/serviceaccount/ca.crt"
        assert config.host_binary_in_container == "/host/usr/local/lib/cnibox/cnibox"
        assert DEFAULTS["SERVICE_ACCOUNT_DIR"] == "/var/run/secrets/kubernetes.io/serviceaccount"

    def test_overrides(self) -> None:
        """Every path follows its variable; KUBE_CA_FILE replaces the sibling ca.crt."""
        config = parse_environment(
            {
                "CONTAINER_MOUNT_PREFIX": "/media",
                "DEST_CNI_NET_DIR": "/config",
                "DEST_CNI_BIN_DIR": "/usr/libexec/cni",
                "KUBECONFIG_FILE_NAME": "/test-linkerd-cni-kubeconfig",
                "SERVICE_ACCOUNT_DIR": "/sa",
                "KUBE_CA_FILE": "/ca/ca.pem",
            }
        )
        assert config.host_net_dir == "/media/config"
        assert config.host_bin_dir == "/media/usr/libexec/cni"
        assert config.plugin_kubeconfig_path == "/config/test-linkerd-cni-kubeconfig"
        assert config.kubeconfig_path == "/media/config/test-linkerd-cni-kubeconfig"
        assert config.token_file == "/sa/token"
        assert config.ca_file == "/ca/ca.pem"

    @pytest.mark.parametrize(
        ("parts", "joined"),
        [
            (("/host", "/etc/cni/net.d"), "/host/etc/cni/net.d"),
            (("/host/", "etc//cni/./net.d/"), "/host/etc/cni/net.d"),
            (("", "/etc"), "/etc"),
            (("//a", "b"), "/a/b"),
            (("a", "../b"), "b"),
            (("", ""), ""),
        ],
    )
    def test_go_path_join(self, parts: tuple[str, ...], joined: str) -> None:
        """Joining cleans like Go's path.Join."""
        assert go_path_join(*parts) == joined


class TestNetworkConfigSources:
    """Upstream TestConfigureCNI, plus the precedence of TestReconfigureCNI's source mixes."""

    SRC = (TESTDATA / "cni-src.json").read_bytes()
    PATH = "/config/test-linkerd-cni-kubeconfig"

    def test_no_source(self) -> None:
        """No sources at all: 'cannot build configuration from any known source'."""
        with pytest.raises(ConfigError, match="cannot build configuration from any known source"):
            choose_network_config([], self.PATH)

    def test_env_not_set_and_file_missing(self) -> None:
        """Unset env and missing file both count as no source."""
        reads = [SourceRead("env:CNI_NETWORK_CONFIG", None), SourceRead("file:x", None)]
        with pytest.raises(ConfigError, match="any known source"):
            choose_network_config(reads, self.PATH)

    def test_env_source_is_substituted(self) -> None:
        """The env source gives cni-exp.json once the placeholder is replaced."""
        out = choose_network_config([SourceRead("env:CNI_NETWORK_CONFIG", self.SRC)], self.PATH)
        assert json.loads(out) == json.loads((TESTDATA / "cni-exp.json").read_bytes())
        assert b"__KUBECONFIG_FILEPATH__" not in out

    def test_env_wins_over_file(self) -> None:
        """Go order: environment first, then the file."""
        reads = [SourceRead("env:CNI_NETWORK_CONFIG", b'{"type":"env"}'), SourceRead("f", self.SRC)]
        assert choose_network_config(reads, self.PATH) == b'{"type":"env"}'

    def test_file_used_when_env_empty(self) -> None:
        """An unset environment source falls through to the file."""
        reads = [SourceRead("env:CNI_NETWORK_CONFIG", None), SourceRead("file:f", self.SRC)]
        assert b"/config/test-linkerd-cni-kubeconfig" in choose_network_config(reads, self.PATH)

    def test_source_names(self) -> None:
        """Sources are named as upstream names them in logs."""
        config = parse_environment({"CNI_NETWORK_CONFIG_FILE": "/etc/x.json"})
        assert source_names(config) == ("env:CNI_NETWORK_CONFIG", "file:/etc/x.json")


class TestKubeconfig:
    """Upstream TestReconfigureK8s: exact texts and the error order."""

    def test_env_ca_file(self) -> None:
        """KUBE_CA_FILE=k8s/ca.crt gives kubeconfig-exp-env.yaml byte for byte."""
        ca = (TESTDATA / "k8s" / "ca.crt").read_bytes()
        out = render_kubeconfig(TOKEN, ca, "localhost", "8080")
        assert out == (TESTDATA / "kubeconfig-exp-env.yaml").read_bytes()

    def test_sibling_ca_file(self) -> None:
        """The ca.crt beside the token gives kubeconfig-exp-sibling.yaml byte for byte."""
        ca = (TESTDATA / "ca.crt").read_bytes()
        out = render_kubeconfig(TOKEN, ca, "localhost", "8080")
        assert out == (TESTDATA / "kubeconfig-exp-sibling.yaml").read_bytes()

    def test_ca_is_trimmed_before_encoding(self) -> None:
        """Trailing whitespace of the CA does not reach the base64 text."""
        a = render_kubeconfig(TOKEN, b"CERT\n\n", "h", "1")
        assert a == render_kubeconfig(TOKEN, b"CERT", "h", "1")

    @pytest.mark.parametrize(
        ("token", "ca", "host", "port", "message"),
        [
            (b"", b"ca", "h", "1", "token-data is zero-length"),
            (TOKEN, b"", "h", "1", "certificate authority data is zero-length"),
            (TOKEN, b"ca", "", "1", "service-host is zero length"),
            (TOKEN, b"ca", "h", "", "service-port is zero length"),
        ],
    )
    def test_errors(self, token: bytes, ca: bytes, host: str, port: str, message: str) -> None:
        """Missing inputs fail with upstream's messages, checked in upstream's order."""
        with pytest.raises(ConfigError, match=message):
            render_kubeconfig(token, ca, host, port)

    def test_ipv6_host_is_bracketed(self) -> None:
        """An IPv6 service host makes a valid URL (upstream pastes it bare)."""
        out = render_kubeconfig(TOKEN, b"ca", "fd00::1", "443").decode()
        assert "    server: https://[fd00::1]:443\n" in out


def test_mountinfo_finds_the_type_of_a_path() -> None:
    """core/mountinfo.py: the longest mount point by whole components, the later of equal
    ones, escapes undone, malformed lines skipped (issue 27 item 8: a config dir on tmpfs)."""
    from multicall.core.mountinfo import fs_type

    text = "\n".join(
        [
            "22 1 8:1 / / rw,relatime shared:1 - ext4 /dev/sda1 rw",
            "30 22 0:40 / /host/etc/cni rw - tmpfs tmpfs rw",
            "31 22 0:41 / /host/etc/cni2 rw - xfs /dev/x rw",
            "32 22 0:42 / /with\\040space rw - tmpfs tmpfs rw",
            "garbage line",
            "33 30 8:1 /x /host/etc/cni rw - ext4 /dev/sda1 rw",
        ]
    )
    assert fs_type("/host/etc/cni/net.d", text) == "ext4"  # mounted over the tmpfs
    assert fs_type("/host/etc/cni2/net.d", text) == "xfs"
    assert fs_type("/host/etc/cnix", text) == "ext4"  # not under /host/etc/cni
    assert fs_type("/with space/a", text) == "tmpfs"
    assert fs_type("/x", "nothing here") == ""

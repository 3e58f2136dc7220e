"""core.installer.conflist: the Go installer's conflist patcher, byte for byte."""

from __future__ import annotations

import hashlib
import json

import pytest
from hypothesis import assume, example, given, settings
from hypothesis import strategies as st

from multicall.core.go.encoding_json.encode import go_float
from multicall.core.installer import conflist
from multicall.core.installer.conflist import Json, insert_linkerd, remove_linkerd, render_go_json
from multicall.errors import ConfigError
from tests.support import FIXTURES
from tests.support.documents import json_text as _text
from tests.support.documents import json_values as _json
from tests.support.installer_host import count_linkerd

TESTDATA = FIXTURES / "upstream" / "proxy-init" / "internal-cni-testdata"
GO_DERIVED = FIXTURES / "derived" / "linkerd-go-installer"
ISTIO = FIXTURES / "upstream" / "istio" / "cni-install-testdata"
PLUGIN_KUBECONFIG = b"/etc/cni/net.d/ZZZ-linkerd-cni-kubeconfig"


def linkerd_config() -> bytes:
    """cni-src.json with the placeholder replaced as the Go test installer does."""
    return (
        (TESTDATA / "cni-src.json")
        .read_bytes()
        .replace(b"__KUBECONFIG_FILEPATH__", PLUGIN_KUBECONFIG)
    )


HASHES = json.loads((GO_DERIVED / "hashes.json").read_text())


class TestGoInstallerFixtures:
    @pytest.mark.parametrize("source", sorted(HASHES))
    def test_insert_matches_upstream_hash(self, source: str) -> None:
        """Patching each upstream input gives the sha256 upstream's TestReconfigureCNI asserts."""
        out = insert_linkerd((TESTDATA / source).read_bytes(), linkerd_config())
        assert hashlib.sha256(out).hexdigest() == HASHES[source]["sha256"]
        assert out == (GO_DERIVED / HASHES[source]["result_file"]).read_bytes()

    @pytest.mark.parametrize("source", sorted(HASHES))
    def test_insert_with_the_plugin_rendered_once_matches_upstream(self, source: str) -> None:
        """The installer's path (the plugin rendered once, issue 30 item 6): upstream's bytes."""
        plugin = conflist.parse_document(linkerd_config())
        rendered = conflist.render_plugin(plugin)
        out = insert_linkerd((TESTDATA / source).read_bytes(), plugin, rendered=rendered)
        assert out == (GO_DERIVED / HASHES[source]["result_file"]).read_bytes()

    @pytest.mark.parametrize("source", sorted(HASHES))
    def test_remove_matches_upstream_after_remove(self, source: str) -> None:
        """Removing linkerd again gives Go's revert output (its sha256 and bytes)."""
        result = (GO_DERIVED / HASHES[source]["result_file"]).read_bytes()
        out = remove_linkerd(result)
        assert out is not None
        assert hashlib.sha256(out).hexdigest() == HASHES[source]["after_remove_sha256"]
        assert out == (GO_DERIVED / (HASHES[source]["result_file"] + ".after-remove")).read_bytes()

    def test_conf_is_upgraded_with_cni_version_0_3_1(self) -> None:
        """A single-plugin .conf becomes a list named k8s-pod-network, cniVersion 0.3.1."""
        out = json.loads(
            insert_linkerd((TESTDATA / "10-calico.conf").read_bytes(), linkerd_config())
        )
        assert out["cniVersion"] == "0.3.1"
        assert out["name"] == "k8s-pod-network"
        assert [p["type"] for p in out["plugins"]] == ["calico", "linkerd-cni"]
        assert "cniVersion" not in out["plugins"][0]
        assert conflist.upgraded_name("/x/10-calico.conf") == "/x/10-calico.conflist"
        assert conflist.upgraded_name("/x/10-calico.conflist") == "/x/10-calico.conflist"

    def test_linkerd_first_is_moved_last(self) -> None:
        """A list where linkerd comes first is reordered: linkerd last, others in order."""
        out = json.loads(
            insert_linkerd((TESTDATA / "10-calico-linkerd.conflist").read_bytes(), linkerd_config())
        )
        assert [p["type"] for p in out["plugins"]] == ["calico", "portmap", "linkerd-cni"]

    def test_output_has_no_trailing_newline_and_two_space_indent(self) -> None:
        """Go's MarshalIndent layout."""
        out = insert_linkerd((TESTDATA / "10-calico.conflist").read_bytes(), linkerd_config())
        assert not out.endswith(b"\n")
        assert out.startswith(b'{\n  "cniVersion": "0.3.1",\n  "name"')

    def test_undo_restores_the_original_document(self) -> None:
        """remove(insert(c)) is c as data (the undo of the Go installer)."""
        original = (TESTDATA / "10-calico.conflist").read_bytes()
        undone = remove_linkerd(insert_linkerd(original, linkerd_config()))
        assert undone is not None
        assert json.loads(undone) == json.loads(original)

    def test_remove_without_linkerd_is_none(self) -> None:
        """Nothing to remove means no rewrite."""
        assert remove_linkerd((TESTDATA / "10-calico.conflist").read_bytes()) is None


class TestRejections:
    @pytest.mark.parametrize(
        ("data", "message"),
        [
            ((TESTDATA / "cni-invalid-plugin.json").read_bytes(), "cannot extract plugin"),
            ((TESTDATA / "cni-no-plugins.json").read_bytes(), "cannot determine plugins"),
            ((ISTIO / "invalid-arr.conflist").read_bytes(), "not a JSON object"),
            ((ISTIO / "invalid-map.conflist").read_bytes(), "cannot determine plugins"),
            (b'{"plugins": [', "not valid JSON"),
            (b"", "not valid JSON"),
            (b"null", "not a JSON object"),
            (b'{"plugins": [{"type": "x", "mtu": NaN}]}', "not valid JSON"),
            (b'{"plugins": [{"type": "x", "mtu": 1e999}]}', "not valid JSON"),
            (b'{"plugins": {"type": "x"}}', "cannot determine plugins"),
            (b'{"type": "linkerd-cni"}', "not a primary config"),
        ],
    )
    def test_bad_primary_configs_raise_config_error(self, data: bytes, message: str) -> None:
        """Every unusable primary config is a ConfigError (the applet logs and skips it)."""
        with pytest.raises(ConfigError, match=message):
            insert_linkerd(data, linkerd_config())

    def test_bad_linkerd_config_raises(self) -> None:
        """The installer's own network config must be an object too."""
        with pytest.raises(ConfigError):
            insert_linkerd((TESTDATA / "10-calico.conflist").read_bytes(), b"[1]")


class TestInvariant:
    def test_duplicate_linkerd_entries_collapse_to_one(self) -> None:
        """Every linkerd entry goes, one comes back (Go would keep a second one)."""
        doc = {
            "name": "n",
            "plugins": [{"type": "linkerd-cni"}, {"type": "a"}, {"type": "linkerd-cni"}],
        }
        out = insert_linkerd(json.dumps(doc).encode(), linkerd_config())
        assert count_linkerd(out) == 1

    def test_cni_config_names(self) -> None:
        """Only .conf and .conflist are patched, as Go's path.Ext test."""
        assert conflist.is_cni_config_name("10-a.conflist")
        assert conflist.is_cni_config_name("/d/10-a.conf")
        assert not conflist.is_cni_config_name("10-a.conf.install")
        assert not conflist.is_cni_config_name("10-a.json")
        assert not conflist.is_cni_config_name("ZZZ-linkerd-cni-kubeconfig")


class TestGoJson:
    @pytest.mark.parametrize(
        ("value", "text"),
        [
            (1e21, "1e+21"),
            (1.5e-7, "1.5e-7"),
            (1e20, "100000000000000000000"),
            (4143.0, "4143"),
            (1e-5, "0.00001"),
            (-0.0, "-0"),
            (0.1, "0.1"),
            (1e100, "1e+100"),
        ],
    )
    def test_floats_in_go_notation(self, value: float, text: str) -> None:
        """float64 values print as strconv.AppendFloat does in encoding/json."""
        assert go_float(value) == text

    def test_html_characters_are_escaped(self) -> None:
        """<, >, &, U+2028 and U+2029 are \\u-escaped; other non-ASCII stays UTF-8."""
        out = render_go_json({"k": "<a&b>\u2028\u2029é"})
        assert out == '{\n  "k": "\\u003ca\\u0026b\\u003e\\u2028\\u2029é"\n}'.encode()

    def test_empty_containers(self) -> None:
        """Empty objects and arrays stay on one line."""
        assert render_go_json({"a": [], "b": {}}) == b'{\n  "a": [],\n  "b": {}\n}'


_plugin = st.fixed_dictionaries(
    {"type": st.sampled_from(["bridge", "calico", "portmap", "linkerd-cni"])},
    optional={"name": _text, "mtu": st.integers(0, 9000), "opt": _json},
)
_conflist = st.fixed_dictionaries(
    {
        "name": _text,
        "cniVersion": st.sampled_from(["0.3.1", "1.0.0"]),
        "plugins": st.lists(_plugin, max_size=5),
    }
)


def _has_a_primary_plugin(doc: dict[str, Json]) -> bool:
    plugins = doc["plugins"]
    return isinstance(plugins, list) and not all(conflist.is_linkerd(p) for p in plugins)


class TestLaws:
    @settings(max_examples=60, deadline=None)
    @given(doc=_conflist)
    def test_a_list_without_a_plugin_besides_linkerd_is_refused(self, doc: dict[str, Json]) -> None:
        """No linkerd-only list is ever made (issue 30.5): `[]` or linkerd alone is refused."""
        assume(not _has_a_primary_plugin(doc))
        with pytest.raises(ConfigError, match="no plugin besides linkerd-cni"):
            insert_linkerd(json.dumps(doc).encode(), linkerd_config())

    @settings(max_examples=60, deadline=None)
    @given(doc=_conflist)
    # -0.0 renders as Go's `-0`, which must read back as negative zero (found by this law)
    @example(doc={"name": "", "cniVersion": "0.3.1", "plugins": [{"type": "b", "opt": -0.0}]})
    def test_insert_is_idempotent_and_leaves_one_entry_last(self, doc: dict[str, Json]) -> None:
        """insert(insert(c)) == insert(c); exactly one linkerd entry, and it is last."""
        assume(_has_a_primary_plugin(doc))
        once = insert_linkerd(json.dumps(doc).encode(), linkerd_config())
        assert insert_linkerd(once, linkerd_config()) == once
        assert count_linkerd(once) == 1
        assert json.loads(once)["plugins"][-1]["type"] == "linkerd-cni"

    @settings(max_examples=60, deadline=None)
    @given(doc=_conflist)
    def test_remove_after_insert_is_the_original_without_linkerd(
        self, doc: dict[str, Json]
    ) -> None:
        """remove(insert(c)) is c minus its linkerd entries, other plugins in order."""
        assume(_has_a_primary_plugin(doc))
        removed = remove_linkerd(insert_linkerd(json.dumps(doc).encode(), linkerd_config()))
        assert removed is not None
        plugins = doc["plugins"]
        assert isinstance(plugins, list)
        expected = {**doc, "plugins": [p for p in plugins if not conflist.is_linkerd(p)]}
        # Compared as Go holds them: every number a float64 (1e16 prints as 10000000000000000).
        assert json.loads(removed, parse_int=float) == json.loads(
            json.dumps(expected), parse_int=float
        )

    @settings(max_examples=60, deadline=None)
    @given(doc=st.one_of(_conflist, _plugin), plugin=_plugin)
    def test_the_plugin_rendered_once_gives_the_same_bytes(
        self, doc: dict[str, Json], plugin: dict[str, Json]
    ) -> None:
        """insert(c, p, rendered=render_plugin(p)) == insert(c, p) byte for byte, for lists
        and single-plugin configs, whatever the plugin holds (nesting, HTML characters)."""
        data = json.dumps(doc).encode()
        try:
            expected = insert_linkerd(data, plugin)
        except ConfigError:
            return  # refused alike: the rendered plugin is never looked at
        rendered = conflist.render_plugin(plugin)
        assert insert_linkerd(data, plugin, rendered=rendered) == expected

    @settings(max_examples=60, deadline=None)
    @given(data=st.binary(max_size=64))
    def test_arbitrary_bytes_raise_only_config_error(self, data: bytes) -> None:
        """Garbage in gives ConfigError, nothing else."""
        with pytest.raises(ConfigError):
            insert_linkerd(b"\xff" + data, linkerd_config())


class TestShellInstallerDecision:
    """Where upstream's shell and Go installers differ, cnibox follows Go (documented)."""

    SHELL = FIXTURES / "derived" / "linkerd-shell-installer"

    @pytest.mark.parametrize(
        "source", ["10-calico.conf", "10-calico.conflist", "10-calico-linkerd.conflist"]
    )
    def test_same_document_as_the_shell_installer_but_go_bytes(self, source: str) -> None:
        """Same data as the shell result, bar cniVersion 0.3.1 for an upgraded .conf."""
        chart = (self.SHELL / "CNI_NETWORK_CONFIG.chart-default.json").read_bytes()
        ours = insert_linkerd(
            (TESTDATA / source).read_bytes(),
            chart.replace(b"__KUBECONFIG_FILEPATH__", PLUGIN_KUBECONFIG),
        )
        shell = json.loads((self.SHELL / f"from-{source}.result").read_bytes())
        if source.endswith(".conf"):
            assert shell["cniVersion"] == "0.3.0"
            shell["cniVersion"] = "0.3.1"
        assert json.loads(ours) == shell
        assert not ours.endswith(b"\n")

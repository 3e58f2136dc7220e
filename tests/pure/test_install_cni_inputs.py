"""install-cni's hostile configs (issue 29's third area): 52 documents a CNI directory may
hold, each with what the patcher (core/installer/conflist.py, the function every install
runs on each file) must do with it: patch it (linkerd-cni chained last, every other plugin
kept in order, and removed again to the same plugins), or refuse it with a plain message
and no output. Upstream's Go installer decodes with encoding/json into map[string]any;
its refusals are the same set (no NaN, no number beyond float64, one document, a plugin
list of objects). The installer around the patcher (journal, undo, concurrency, kills) is
covered by tests/pure/test_install_cni_never_loses.py and test_install_cni_stateful.py.
"""

from __future__ import annotations

import json

import pytest

from multicall.core.installer.conflist import insert_linkerd, remove_linkerd
from multicall.errors import ConfigError
from tests.support.plain import assert_plain

LINKERD = b'{"type":"linkerd-cni","name":"linkerd-cni","log_level":"info"}'
CALICO = '{"type":"calico","ipam":{"type":"calico-ipam"}}'
PORTMAP = '{"type":"portmap","capabilities":{"portMappings":true}}'


def conflist(*plugins: str, extra: str = "") -> bytes:
    return f'{{"name":"k8s-pod-network","cniVersion":"0.3.1",{extra}"plugins":[{",".join(plugins)}]}}'.encode()  # noqa: E501


PATCHED = "patched"
NOT_JSON = "is not valid JSON"
NOT_OBJECT = "is not a JSON object"
NO_PLUGINS = "cannot determine plugins"
NOT_PLUGIN = "cannot extract plugin"
ONLY_LINKERD = "no plugin besides linkerd-cni"

CASES: list[tuple[str, bytes, str]] = [
    ("calico-portmap", conflist(CALICO, PORTMAP), PATCHED),
    ("one-plugin-list", conflist(CALICO), PATCHED),
    ("single-conf", b'{"cniVersion":"0.3.1","name":"b","type":"bridge","bridge":"cni0"}', PATCHED),
    ("single-conf-no-version", b'{"name":"b","type":"bridge"}', PATCHED),
    ("linkerd-last-already", conflist(CALICO, LINKERD.decode()), PATCHED),
    ("linkerd-in-middle", conflist(CALICO, LINKERD.decode(), PORTMAP), PATCHED),
    ("linkerd-twice", conflist(LINKERD.decode(), CALICO, LINKERD.decode()), PATCHED),
    ("100-plugins", conflist(*[f'{{"type":"p{i}"}}' for i in range(100)]), PATCHED),
    ("unicode", conflist('{"type":"caf\u00e9","x":"\u2603\U0001f600"}'), PATCHED),
    ("escaped-unicode", conflist('{"type":"c","x":"\\u00e9\\ud83d\\ude00"}'), PATCHED),
    ("lone-surrogate-escape", conflist('{"type":"c","x":"\\ud800"}'), PATCHED),
    ("invalid-utf8-in-string", b'{"name":"n\xff","plugins":[{"type":"calico"}]}', PATCHED),
    ("escaped-nul", conflist('{"type":"c","x":"a\\u0000b"}'), PATCHED),
    ("duplicate-keys", b'{"name":"a","name":"b","plugins":[{"type":"calico"}]}', PATCHED),
    ("negative-zero", conflist('{"type":"c","mtu":-0}'), PATCHED),
    ("big-int", conflist('{"type":"c","n":18446744073709551616}'), PATCHED),
    ("309-digit-number", conflist('{"type":"c","n":' + "9" * 308 + "}"), PATCHED),
    ("float-exponents", conflist('{"type":"c","a":1e308,"b":1E-400,"c":0.1e1}'), PATCHED),
    ("deep-args-100", conflist('{"type":"c","x":' + "[" * 100 + "]" * 100 + "}"), PATCHED),
    ("plugin-without-type", conflist('{"x":1}', CALICO), PATCHED),
    ("plugin-type-number", conflist('{"type":1}'), PATCHED),
    ("single-type-number", b'{"name":"b","type":5}', PATCHED),
    ("whitespace-around", b"\n\t " + conflist(CALICO) + b" \r\n", PATCHED),
    ("1mib-string", conflist('{"type":"c","x":"' + "y" * (1 << 20) + '"}'), PATCHED),
    ("empty-file", b"", NOT_JSON),
    ("whitespace-only", b"   \n", NOT_JSON),
    ("null", b"null", NOT_OBJECT),
    ("array", b"[]", NOT_OBJECT),
    ("string", b'"x"', NOT_OBJECT),
    ("number", b"1", NOT_OBJECT),
    ("truncated", conflist(CALICO)[:-2], NOT_JSON),
    ("trailing-comma", b'{"name":"n","plugins":[{"type":"c"},]}', NOT_JSON),
    ("comment", b'// calico\n{"name":"n","plugins":[{"type":"c"}]}', NOT_JSON),
    ("single-quotes", b"{'name':'n','plugins':[{'type':'c'}]}", NOT_JSON),
    ("nan", conflist('{"type":"c","x":NaN}'), NOT_JSON),
    ("infinity", conflist('{"type":"c","x":-Infinity}'), NOT_JSON),
    ("1e400", conflist('{"type":"c","x":1e400}'), "out of range"),
    ("5000-digit-number", conflist('{"type":"c","x":' + "9" * 5000 + "}"), "out of range"),
    ("deep-20000", conflist('{"type":"c","x":' + "[" * 20000 + "]" * 20000 + "}"), NOT_JSON),
    ("raw-nul", b'{"name":"n\x00","plugins":[{"type":"c"}]}', NOT_JSON),
    ("raw-newline-in-string", b'{"name":"a\nb","plugins":[{"type":"c"}]}', NOT_JSON),
    ("bom", b"\xef\xbb\xbf" + conflist(CALICO), NOT_JSON),
    ("utf16", conflist(CALICO).decode().encode("utf-16"), NOT_JSON),
    ("two-documents", conflist(CALICO) + b"{}", NOT_JSON),
    ("trailing-garbage", conflist(CALICO) + b" x", NOT_JSON),
    ("no-plugins-key", b'{"name":"n","cniVersion":"0.3.1"}', NO_PLUGINS),
    ("plugins-object", b'{"name":"n","plugins":{"type":"c"}}', NO_PLUGINS),
    ("plugins-null", b'{"name":"n","plugins":null}', NO_PLUGINS),
    ("plugins-string", b'{"name":"n","plugins":"calico"}', NO_PLUGINS),
    ("plugin-number", conflist("1"), NOT_PLUGIN),
    ("plugin-null", conflist("null", CALICO), NOT_PLUGIN),
    ("plugins-empty", conflist(), ONLY_LINKERD),
    ("plugins-only-linkerd", conflist(LINKERD.decode()), ONLY_LINKERD),
    ("single-linkerd", LINKERD, "not a primary config"),
]


def test_the_list_is_long_enough() -> None:
    assert len(CASES) >= 50
    assert len({name for name, _, _ in CASES}) == len(CASES)


def _types(document: bytes) -> list[object]:
    doc = json.loads(document)
    plugins = doc.get("plugins", [doc])
    return [p.get("type") for p in plugins]


@pytest.mark.parametrize(("name", "data", "outcome"), CASES, ids=[c[0] for c in CASES])
def test_hostile_config(name: str, data: bytes, outcome: str) -> None:
    if outcome != PATCHED:
        with pytest.raises(ConfigError) as caught:
            insert_linkerd(data, LINKERD)
        assert outcome in caught.value.message
        assert_plain(caught.value.message)
        assert len(caught.value.message) < 400
        return
    patched = insert_linkerd(data, LINKERD)
    types = _types(patched)
    assert types[-1] == "linkerd-cni"
    assert "linkerd-cni" not in types[:-1]
    original = [t for t in _types(data.decode("utf-8", "replace").encode()) if t != "linkerd-cni"]
    assert types[:-1] == original
    assert insert_linkerd(patched, LINKERD) == patched  # idempotent
    removed = remove_linkerd(patched)
    assert removed is not None
    assert _types(removed) == original

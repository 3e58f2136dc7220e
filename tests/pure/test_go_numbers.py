"""Numbers of any length read as Go reads them (issue 29 class 1).

CPython's `int()` refuses more than 4,300 digits; Go reads any length. Each parser is held
against a reference written here the way Go's source is (a left-to-right loop over bytes),
for inputs of any length, and the plugin is run on the examples of the issue.
"""

from __future__ import annotations

import json

import pytest
from hypothesis import given
from hypothesis import strategies as st

from multicall.core.firewall.ports import Syntax, parse_port_range
from multicall.core.go.net import go_cidr
from multicall.core.go.strconv import NumError, go_atoi
from multicall.core.netns_exec import parse_ulong
from multicall.errors import FirewallError
from tests.pure.test_plugin_seam import Node, config
from tests.support.fuzzing import fuzz
from tests.support.plain import assert_plain
from tests.support.pods import MESHED, renamed

MAX_UINT64 = 2**64 - 1


def go_atoi_reference(s: str) -> tuple[int | None, str | None]:
    """strconv.Atoi for 64-bit int, transcribed from Go's atoi.go (ParseInt -> ParseUint):
    the value, or the error's last word."""
    neg, body = s[:1] == "-", s[1:] if s[:1] in ("+", "-") else s
    if body == "":
        return None, "invalid syntax"
    n, cutoff = 0, MAX_UINT64 // 10 + 1
    for c in body:
        if not "0" <= c <= "9":
            return None, "invalid syntax"
        if n >= cutoff:
            return None, "value out of range"
        n = n * 10 + ord(c) - 48
        if n > MAX_UINT64:
            return None, "value out of range"
    if (not neg and n >= 2**63) or (neg and n > 2**63):
        return None, "value out of range"
    return (-n if neg else n), None


def go_dtoi_prefix(mask: str) -> int | None:
    """net.ParseCIDR's prefix: dtoi over the whole text (stops at 0xFFFFFF)."""
    n, i = 0, 0
    while i < len(mask) and "0" <= mask[i] <= "9":
        n = n * 10 + ord(mask[i]) - 48
        if n >= 0xFFFFFF:
            return None
        i += 1
    return n if i and i == len(mask) else None


# Text that reaches the parsers: digits (often long zero runs), signs, junk bytes.
DIGITS = st.text("0123456789", min_size=0, max_size=30)
ZEROS = st.integers(0, 6000).map(lambda k: "0" * k)
NUMBERISH = st.builds(
    lambda sign, zeros, digits, tail: sign + zeros + digits + tail,
    st.sampled_from(["", "", "+", "-", "--"]),
    ZEROS,
    DIGITS,
    st.sampled_from(["", "", "", "x", " ", "_1", "٣", "9" * 25]),
)


class TestAtoi:
    @fuzz(400)
    @given(NUMBERISH)
    def test_matches_go_whatever_the_length(self, text: str) -> None:
        """Go's value or Go's error word, for zero runs past CPython's 4,300 digits."""
        value, error = go_atoi_reference(text)
        if error is None:
            assert go_atoi(text) == value
        else:
            with pytest.raises(NumError) as caught:
                go_atoi(text)
            assert str(caught.value) == f'strconv.Atoi: parsing "{text}": {error}'

    @pytest.mark.parametrize(
        ("text", "outcome"),
        [
            ("0" * 5000 + "2102", 2102),
            ("-" + "0" * 5000 + "1", -1),
            ("99999999999999999999x", "value out of range"),  # overflow is seen first
            ("1" * 5000, "value out of range"),
            ("0" * 5000 + "x", "invalid syntax"),
        ],
    )
    def test_examples(self, text: str, outcome: int | str) -> None:
        if isinstance(outcome, int):
            assert go_atoi(text) == outcome
        else:
            with pytest.raises(NumError, match=outcome):
                go_atoi(text)


class TestOtherParsers:
    @fuzz(300)
    @given(st.builds(lambda z, d, t: z + d + t, ZEROS, DIGITS, st.sampled_from(["", "x", "-"])))
    def test_cidr_prefix_matches_go_dtoi(self, mask: str) -> None:
        """A prefix of any length: Go's /24 for `/000…024`, Go's refusal otherwise."""
        bits = go_dtoi_prefix(mask)
        expected = None if bits is None or bits > 32 else f"10.0.0.0/{bits}"
        assert go_cidr(f"10.0.0.0/{mask}") == expected

    @fuzz(200)
    @given(st.builds(lambda z, d: z + d, ZEROS, DIGITS.filter(bool)))
    def test_iptables_ports_of_any_length(self, text: str) -> None:
        """xtables_parse_port (strtoul): zero runs are fine; past 65535 is its refusal."""
        value = int(text.lstrip("0") or "0") if len(text.lstrip("0")) < 30 else 2**99
        if value <= 65535:
            assert parse_port_range(text, Syntax.IPTABLES).render(":") == str(value)
        else:
            with pytest.raises(FirewallError, match="invalid port/service"):
                parse_port_range(text, Syntax.IPTABLES)

    def test_nsenter_numbers_of_any_length(self) -> None:
        """strtoul_or_err: leading zeros of any length, and ERANGE for a long value."""
        assert parse_ulong("0" * 5000 + "12", "pid") == 12
        assert "Numerical result out of range" in str(parse_ulong("9" * 5000, "pid"))


# ----------------------------------------------------------------------------- the plugin


def add(**annotations: str) -> Node:
    node = Node()
    pod = renamed(MESHED, "numbers", **annotations)
    node.kube.add_pod(pod)
    result = node.run("ADD", pod=pod)
    assert result.exit_code == 0, result.stdout
    assert node.run("CHECK", pod=pod).exit_code == 0
    return node


class TestPlugin:
    def test_long_proxy_uid_annotation_is_gos_number(self) -> None:
        """`'0'*5000+'2102'`: Go's Atoi reads 2102 (was CNI error 999 "ValueError: …")."""
        node = add(**{"config.linkerd.io/proxy-uid": "0" * 5000 + "2102"})
        assert node.firewall.applied[0].options.proxy_uid == 2102

    def test_long_skip_subnets_prefix(self) -> None:
        """A 5,000-digit zero-padded prefix is /8 in Go; the rule matches 10.0.0.0/8 and its
        comment is what iptables keeps of upstream's: the first 255 bytes."""
        subnet = "10.0.0.0/" + "0" * 5000 + "8"
        node = add(**{"config.linkerd.io/skip-subnets": subnet})
        (rule,) = [r for r in node.nat().rules_of("PROXY_INIT_REDIRECT") if "-s" in r.spec]
        assert rule.spec[:2] == ("-s", "10.0.0.0/8")
        comment = rule.spec[rule.spec.index("--comment") + 1]
        assert comment == ("proxy-init/ignore-subnet-" + subnet)[:255]

    def test_300_digit_prefix_comment_fits_iptables(self) -> None:
        """300 digits: the comment is cut where iptables cuts it, so CHECK finds no drift."""
        node = add(**{"config.linkerd.io/skip-subnets": "10.0.0.0/" + "0" * 300 + "8"})
        comments = [r.spec[r.spec.index("--comment") + 1] for r in node.nat().rules]
        assert max(len(c.encode()) for c in comments) == 255

    def test_long_zero_padded_port_is_port_80(self) -> None:
        """`'0'*5000+'80'` in skip-inbound-ports: Go skips port 80 (was silently dropped)."""
        node = add(**{"config.linkerd.io/skip-inbound-ports": "0" * 5000 + "80"})
        assert node.nat().rules_of("PROXY_INIT_REDIRECT")[0].spec[5] == "4191,4190,80"

    def test_long_proxy_uid_in_the_config_is_gos_type_error(self) -> None:
        """A 5,000-digit `proxy-uid` number: encoding/json's error, not Python's."""
        number = "1" + "0" * 5000
        stdin = config().replace(b'"proxy-uid": 2102', f'"proxy-uid": {number}'.encode())
        assert number.encode() in stdin
        result = Node().run("ADD", stdin)
        msg = json.loads(result.stdout)["msg"]
        assert msg == (
            "linkerd-cni: failed to parse network configuration: json: cannot unmarshal number "
            f"{number} into Go struct field ProxyInit.linkerd.proxy-uid of type int"
        )
        assert_plain(msg)

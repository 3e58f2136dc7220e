"""Unusual iptables-save texts for `iptables-verify --input` (issue 29: the adversarial pass
did not reach them), each with the outcome expected: 0 the redirect is as ADD programs it,
1 drift (named), 2 the text is not a save iptables-restore reads (named by line). Whether
iptables-restore reads each text is checked against Debian's iptables-legacy-restore
--test in a throwaway netns (tests/netns/test_unusual_saves.py); the verdicts themselves by
tests/pure/test_unusual_saves.py, whose config is the default-nft scenario's.
"""

from __future__ import annotations

from dataclasses import dataclass

from tests.support.paths import FIXTURES

BASE = (FIXTURES / "derived/linkerd-iptables/default-nft.iptables-save.txt").read_text()
HEAD, _, TAIL = BASE.partition("*nat\n")
NAT = "*nat\n" + TAIL.split("COMMIT\n")[0] + "COMMIT\n"
REDIRECT_IN = "-A PROXY_INIT_REDIRECT -p tcp -m comment --comment "
JUMP_OUT = (
    '-A OUTPUT -m comment --comment "proxy-init/install-proxy-init-output" -j PROXY_INIT_OUTPUT\n'
)


@dataclass(frozen=True)
class Save:
    name: str
    text: str
    exit: int  # 0 as programmed, 1 drift, 2 refused as not a save
    says: str = ""  # a part of the output (the drift line, or the refusal)
    restore_reads: bool | None = None  # None: exit != 2 says it


def _sub(old: str, new: str, text: str = BASE) -> str:
    assert old in text, old
    return text.replace(old, new, 1)


def _filter(rules: str) -> str:
    return f"*filter\n:INPUT ACCEPT [0:0]\n:FORWARD ACCEPT [0:0]\n:OUTPUT ACCEPT [0:0]\n{rules}COMMIT\n"  # noqa: E501 - one case a line


SAVES: tuple[Save, ...] = (
    Save("as-saved", BASE, 0),
    # CRLF: iptables-restore reads "nat\r" as the table name and fails; cnibox reads the
    # lines as a save edited elsewhere (a documented difference).
    Save("crlf", BASE.replace("\n", "\r\n"), 0, restore_reads=False),
    Save("no-trailing-newline", BASE.rstrip("\n"), 0),
    Save("blank-lines", BASE.replace("\n", "\n\n"), 0),
    Save("comment-lines", BASE.replace("\n-A", "\n# a note\n-A"), 0),
    Save("nft-warning-line", "# Warning: iptables-legacy tables present, use iptables-legacy-save to see them\n" + BASE, 0),  # noqa: E501 - one case a line
    Save("leading-spaces", BASE.replace("\n-A", "\n   -A"), 0),
    Save("tab-separated", _sub("-A PROXY_INIT_OUTPUT -o lo", "-A\tPROXY_INIT_OUTPUT\t-o\tlo"), 0),
    Save("double-spaces", _sub("-A PROXY_INIT_OUTPUT -o lo", "-A  PROXY_INIT_OUTPUT  -o   lo"), 0),
    Save("chain-without-counters", BASE.replace(" [0:0]", ""), 0),
    Save("big-counters", BASE.replace("[0:0]", "[18446744073709551615:18446744073709551615]"), 0),
    Save("rule-counters", BASE.replace("\n-A", "\n[5:300] -A"), 0),
    Save("long-options", _sub("-A PROXY_INIT_OUTPUT -o lo", "-A PROXY_INIT_OUTPUT --out-interface lo"), 0),  # noqa: E501 - one case a line
    Save("protocol-long", _sub(REDIRECT_IN + '"proxy-init/redirect-all-incoming', "-A PROXY_INIT_REDIRECT --protocol tcp -m comment --comment \"proxy-init/redirect-all-incoming"), 0),  # noqa: E501 - one case a line
    Save("options-reordered", _sub('-A PROXY_INIT_OUTPUT -o lo -m comment --comment "proxy-init/ignore-loopback" -j RETURN', '-A PROXY_INIT_OUTPUT -m comment --comment "proxy-init/ignore-loopback" -o lo -j RETURN'), 0),  # noqa: E501 - one case a line
    Save("comment-unquoted", _sub('"proxy-init/ignore-loopback"', "proxy-init/ignore-loopback"), 0),
    Save("comment-single-quotes", _sub('"proxy-init/ignore-loopback"', "'proxy-init/ignore-loopback'"), 1, "ignore-loopback"),  # noqa: E501 - one case a line
    Save("two-nat-tables-last-counts", NAT.replace("4143", "9999") + BASE, 0),
    Save("two-nat-tables-last-drifts", BASE + NAT.replace("4143", "9999"), 1, "9999"),
    Save("filter-and-mangle-around", _filter("-A INPUT -j DROP\n") + BASE + "*mangle\n:PREROUTING ACCEPT [0:0]\n-A PREROUTING -j DROP\nCOMMIT\n", 0),  # noqa: E501 - one case a line
    Save("security-table", "*security\n:INPUT ACCEPT [0:0]\nCOMMIT\n" + BASE, 0),
    Save("raw-notrack-udp", "*raw\n:PREROUTING ACCEPT [0:0]\n-A PREROUTING -p udp -j NOTRACK\nCOMMIT\n" + BASE, 0),  # noqa: E501 - one case a line
    Save("raw-notrack-tcp", "*raw\n:OUTPUT ACCEPT [0:0]\n-A OUTPUT -p tcp -j NOTRACK\nCOMMIT\n" + BASE, 1, "untracked in the raw table"),  # noqa: E501 - one case a line
    Save("raw-ct-notrack-after-nat", BASE + "*raw\n:PREROUTING ACCEPT [0:0]\n-A PREROUTING -j CT --notrack\nCOMMIT\n", 1, "untracked in the raw table"),  # noqa: E501 - one case a line
    Save("no-nat-table", _filter(""), 1, "missing"),
    Save("empty", "", 1, "missing"),
    Save("only-comments", "# nothing\n# here\n", 1, "missing"),
    Save("jump-missing", BASE.replace(JUMP_OUT, ""), 1, "PROXY_INIT_OUTPUT"),
    Save("jump-twice", BASE.replace(JUMP_OUT, JUMP_OUT * 2), 1, "duplicate"),
    Save("rule-removed", _sub('-A PROXY_INIT_OUTPUT -o lo -m comment --comment "proxy-init/ignore-loopback" -j RETURN\n', ""), 1, "ignore-loopback"),  # noqa: E501 - one case a line
    Save("rules-swapped", _sub('-A PROXY_INIT_OUTPUT -o lo -m comment --comment "proxy-init/ignore-loopback" -j RETURN\n-A PROXY_INIT_OUTPUT -p tcp', '-A PROXY_INIT_OUTPUT -p tcp', BASE).replace("-j REDIRECT --to-ports 4140\n", '-j REDIRECT --to-ports 4140\n-A PROXY_INIT_OUTPUT -o lo -m comment --comment "proxy-init/ignore-loopback" -j RETURN\n', 1), 1, "ignore-loopback"),  # noqa: E501 - one case a line
    Save("port-changed", BASE.replace("--to-ports 4143", "--to-ports 4144"), 1, "4144"),
    Save("extra-rule-in-owned-chain", _sub("COMMIT", "-A PROXY_INIT_REDIRECT -j ACCEPT\nCOMMIT"), 1, "-A PROXY_INIT_REDIRECT -j ACCEPT"),  # noqa: E501 - one case a line
    Save("accept-ahead-of-jump", _sub("-A OUTPUT ", "-A OUTPUT -j ACCEPT\n-A OUTPUT "), 1, "bypass"),  # noqa: E501 - one case a line
    Save("kube-proxy-rules", _sub("COMMIT", ":KUBE-SERVICES - [0:0]\n-A KUBE-SERVICES -d 10.96.0.1/32 -p tcp -j RETURN\nCOMMIT").replace(":PROXY_INIT_OUTPUT", ":KUBE-X - [0:0]\n:PROXY_INIT_OUTPUT"), 0),  # noqa: E501 - one case a line
    Save("policy-drop-prerouting", BASE.replace(":PREROUTING ACCEPT", ":PREROUTING DROP"), 0),
    Save("chain-declared-twice", _sub(":PROXY_INIT_OUTPUT - [0:0]\n", ":PROXY_INIT_OUTPUT - [0:0]\n:PROXY_INIT_OUTPUT - [0:0]\n"), 2),  # noqa: E501 - one case a line
    Save("missing-commit", BASE.replace("COMMIT\n", ""), 2, "COMMIT"),
    Save("commit-lowercase", BASE.replace("COMMIT", "commit"), 2),
    Save("rule-before-table", "-A OUTPUT -j ACCEPT\n" + BASE, 2, "line 1"),
    Save("unknown-chain", _sub("COMMIT", "-A NOPE -j ACCEPT\nCOMMIT"), 2, "NOPE"),
    # restore ignores what follows the table name, an unterminated quote, and -Z; cnibox
    # refuses them as not what iptables-save prints (documented differences).
    Save("table-name-extra-word", BASE.replace("*nat", "*nat extra"), 2, restore_reads=True),
    Save("table-name-missing", BASE.replace("*nat", "*"), 2),
    Save("unterminated-quote", _sub('"proxy-init/ignore-loopback"', '"proxy-init/ignore-loopback'), 2, restore_reads=True),  # noqa: E501 - one case a line
    Save("nul-byte", _sub("ignore-loopback", "ignore\x00loopback"), 1, "ignore"),  # drift
    Save("dash-a-alone", _sub("COMMIT", "-A\nCOMMIT"), 2),
    Save("unknown-command", _sub("COMMIT", "-Z OUTPUT\nCOMMIT"), 2, restore_reads=True),
    Save("nested-table", BASE.replace("COMMIT\n", "*filter\nCOMMIT\n", 1), 2),
    Save("garbage", "garbage\n", 2, "line 1"),
    Save("bom", "\ufeff" + BASE, 2),
    Save("long-comment-line", _sub('"proxy-init/ignore-loopback"', '"' + "x" * 70_000 + '"'), 2),
    Save("invalid-utf8-in-comment", _sub("proxy-init/ignore-loopback", "proxy-init/ignore-loop\udcffback"), 1, "loop"),  # noqa: E501 - one case a line
)  # fmt: skip

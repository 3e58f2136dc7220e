"""The derived linkerd-iptables scenarios (tests/fixtures/derived/linkerd-iptables/): each
one's effective options, the save text and argv upstream's run produced, and its errors."""

from __future__ import annotations

import json
import re
from pathlib import Path

from multicall.core.firewall.iptables_save import parse_save
from multicall.core.firewall.model import Family, Mode, ProxyInitOptions
from multicall.core.firewall.ruleset import Table
from tests.support.paths import FIXTURES
from tests.support.rulesets import last_table

SCENARIOS = FIXTURES / "derived" / "linkerd-iptables"
EXISTING = FIXTURES / "upstream" / "proxy-init" / "iptables" / "existing-rules.iptables-save.txt"
NAMES = sorted(p.name.removesuffix(".scenario.json") for p in SCENARIOS.glob("*.scenario.json"))
# Upstream's failure that cnibox avoids on purpose, as linkerd2-proxy-init#696 does: each
# family's pass skips the other family's subnets (docs/linkerd-cni.md). Its fixture still
# records upstream's run; tests/pure/test_proxy_init.py checks the difference against it.
FILTERED_BY_FAMILY = "error-ipv4-subnet-in-ip6tables"
OK_NAMES = [n for n in NAMES if not n.startswith("error-")]
ERROR_NAMES = [n for n in NAMES if n.startswith("error-") and n != FILTERED_BY_FAMILY]


def scenario(name: str) -> dict[str, object]:
    data: dict[str, object] = json.loads((SCENARIOS / f"{name}.scenario.json").read_text())
    return data


def scenario_options(name: str) -> ProxyInitOptions:
    raw = scenario(name)["effective_options_after_annotation_merge"]
    assert isinstance(raw, dict)
    return ProxyInitOptions(
        incoming_proxy_port=raw["incoming-proxy-port"],
        outgoing_proxy_port=raw["outgoing-proxy-port"],
        proxy_uid=raw["proxy-uid"],
        proxy_gid=raw["proxy-gid"],
        ports_to_redirect=tuple(raw["ports-to-redirect"]),
        inbound_ports_to_ignore=tuple(raw["inbound-ports-to-ignore"]),
        outbound_ports_to_ignore=tuple(raw["outbound-ports-to-ignore"]),
        subnets_to_ignore=tuple(raw["subnets-to-ignore"]),
        use_wait_flag=raw["use-wait-flag"],
    )


def scenario_family(name: str) -> Family:
    return Family.IPV6 if str(scenario(name)["iptables_binary"]).startswith("ip6") else Family.IPV4


def scenario_mode(name: str) -> Mode:
    return Mode.NFT if str(scenario(name)["iptables_binary"]).endswith("-nft") else Mode.LEGACY


def times_applied(name: str) -> int:
    return int(str(scenario(name)["times_applied_to_same_netns"]))


def fixture_argv(name: str) -> list[tuple[str, ...]]:
    lines = (SCENARIOS / f"{name}.argv.jsonl").read_text().splitlines()
    return [tuple(json.loads(line)) for line in lines if line.strip()]


def save_body(text: str) -> list[str]:
    """The last `*nat ... COMMIT` block of a save text as tests compare it (comparable_save)."""
    lines = comparable_save(text).splitlines()
    start = max(i for i, line in enumerate(lines) if line == "*nat")
    return lines[start:]


def fixture_body(name: str) -> list[str]:
    return save_body((SCENARIOS / f"{name}.iptables-save.txt").read_text())


def fixture_error(name: str) -> str:
    first = (SCENARIOS / f"{name}.error.txt").read_text().splitlines()[0]
    return first.removeprefix("FAILED rc=2: ")


def parse_existing(path: Path) -> Table:
    """Upstream's existing-rules dump as a table (through the verifier's save parser)."""
    table = last_table(parse_save(path.read_text()), "nat")
    assert table is not None
    return table


# A chain line's packet/byte counters: `:PREROUTING ACCEPT [1:40]`.
_CHAIN_COUNTERS = re.compile(r"^(:\S+ \S+) \[\d+:\d+\]$")


def comparable_save(text: str) -> str:
    """Save text as tests compare it: no timestamped comment lines, no blank lines, and chain
    counters zeroed. Counters are traffic, not rules: a stray packet reaching a pod's netns (a
    TCP reset for a previous holder of its IP, say) moves a legacy nat policy's counter."""
    lines = (line for line in text.splitlines() if line and not line.startswith("#"))
    return "".join(_CHAIN_COUNTERS.sub(r"\1 [0:0]", line) + "\n" for line in lines)


def fixture_text(name: str) -> str:
    """A scenario's save text as a save tool prints it today (comments dropped)."""
    return comparable_save((SCENARIOS / f"{name}.iptables-save.txt").read_text())


def netconf(name: str, **linkerd: object) -> dict[str, object]:
    """A plugin config whose `linkerd` block holds the scenario's effective options."""
    data = scenario(name)
    merged = data["effective_options_after_annotation_merge"]
    assert isinstance(merged, dict)
    binary = str(data["iptables_binary"])
    block = {
        **merged,
        "iptables-mode": "legacy" if "legacy" in binary else "nft",
        "ipv6": "ip6tables" in binary,
        **linkerd,
    }
    return {"cniVersion": "1.0.0", "name": "linkerd-cni", "type": "linkerd-cni", "linkerd": block}


# --- every fixture holding iptables-save or -restore text ------------------------------

# Istio's dry-run goldens record the commands a stubbed run executed (`iptables-save`, ...)
# followed by the restore payload; the payload is what iptables parses.
_RECORDED_COMMAND = re.compile(r"^ip6?tables(-[a-z]+)*( .*)?$")


def save_texts() -> list[Path]:
    """Every file under tests/fixtures holding iptables-save or -restore text."""
    found = []
    for path in sorted(FIXTURES.rglob("*")):
        if path.is_file() and path.suffix not in (".json", ".jsonl", ".md"):
            text = path.read_text(errors="replace")
            if re.search(r"^COMMIT\s*$", text, re.M):
                found.append(path)
    return found


def payload(path: Path) -> str:
    lines = path.read_text().split("\n")
    return "\n".join(line for line in lines if not _RECORDED_COMMAND.match(line))

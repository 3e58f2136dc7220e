"""Differential test: prevResult parsing, conversion and printing against the Go CNI library.

tests/support/libcni/result_oracle.go replays upstream's steps (version.NewResult with the config's
version, up-conversion, PrintResult in the config's version) with Debian's
containernetworking/cni 1.1.2. Its 0.x types and converters are those of v1.3.0 (the version
upstream links), so for configs 0.1.0-0.4.0 and routes without the 1.1.0 extras every output
byte and every error text must agree; the 1.x formatting is pinned by the fixtures instead.
"""

from __future__ import annotations

import base64
import json
import random
import subprocess
from pathlib import Path
from typing import Any

import pytest

from multicall.core.cni import result as cni_result
from multicall.core.cni import skel as cni
from tests.support.libcni import SOURCE, build_go

ORACLE_SOURCE = SOURCE.with_name("result_oracle.go")
CONFIG_VERSIONS = ("0.1.0", "0.2.0", "0.3.0", "0.3.1", "0.4.0")
ADDRESSES = (
    "10.42.0.7/24", "10.0.0.1/32", "0.0.0.0/0", "fd00::1/64", "FD00:0:0::0001/128",
    "::ffff:10.1.2.3/120", "::ffff:10.1.2.3/90", "10.0.0.1", "010.0.0.1/8", "10.0.0.1/33",
    "1.2.3.4/08", "fe80::1%eth0/64", "", "::/0",
)  # fmt: skip
GATEWAYS = ("10.42.0.1", "fd00::1", "::ffff:1.2.3.4", "", "10.0.0.256", "1:0:0:1:0:0:0:1")


def spell(rng: random.Random, key: str) -> str:
    return key if rng.random() < 0.85 else rng.choice([key.upper(), key.title()])


def maybe(rng: random.Random, good: Any, bad: tuple[Any, ...] = (None, 5, "x", [], {})) -> Any:
    return good if rng.random() < 0.95 else rng.choice(bad)


def obj(rng: random.Random, items: dict[str, Any]) -> dict[str, Any]:
    return {spell(rng, k): v for k, v in items.items() if rng.random() < 0.85}


def route(rng: random.Random) -> dict[str, Any]:
    return obj(rng, {"dst": maybe(rng, rng.choice(ADDRESSES)),
                     "gw": maybe(rng, rng.choice(GATEWAYS))})  # fmt: skip


def dns(rng: random.Random) -> Any:
    return maybe(rng, obj(rng, {
        "nameservers": [rng.choice(["10.43.0.10", "fd00::a"])] * rng.randint(0, 2),
        "domain": rng.choice(["", "cluster.local", "a<b>&c"]),
        "search": ["svc"] * rng.randint(0, 1),
        "options": ["ndots:5"] * rng.randint(0, 1),
    }))  # fmt: skip


def legacy_block(rng: random.Random) -> Any:
    return maybe(rng, obj(rng, {
        "ip": maybe(rng, rng.choice(ADDRESSES)), "gateway": maybe(rng, rng.choice(GATEWAYS)),
        "routes": [route(rng) for _ in range(rng.randint(0, 2))]}))  # fmt: skip


def prev_result(rng: random.Random, version: str) -> dict[str, Any]:
    own = rng.choice(["", "0.1.0", "0.2.0"] if version < "0.3.0" else ["0.3.0", "0.3.1", "0.4.0"])
    cni_version = maybe(rng, own, ("", "1.0.0", "0.2.0", "0.4.0", 1))
    if version < "0.3.0" and rng.random() < 0.8:
        return obj(rng, {"cniVersion": cni_version, "ip4": legacy_block(rng),
                         "ip6": legacy_block(rng), "dns": dns(rng)})  # fmt: skip
    ips = [obj(rng, {"version": maybe(rng, rng.choice(["4", "6", "", "5"])),
                     "interface": maybe(rng, rng.choice([0, 1, 2]), (None, "0", 1.5, -1)),
                     "address": maybe(rng, rng.choice(ADDRESSES)),
                     "gateway": maybe(rng, rng.choice(GATEWAYS))})
           for _ in range(rng.randint(0, 3))]  # fmt: skip
    interfaces = [obj(rng, {"name": maybe(rng, "eth0"), "mac": maybe(rng, "aa:bb:cc:dd:ee:ff"),
                            "sandbox": maybe(rng, "/var/run/netns/x")})
                  for _ in range(rng.randint(0, 2))]  # fmt: skip
    routes = [route(rng) for _ in range(rng.randint(0, 2))]
    return obj(rng, {"cniVersion": cni_version, "interfaces": maybe(rng, interfaces),
                     "ips": maybe(rng, ips), "routes": routes, "dns": dns(rng)})  # fmt: skip


def ours(version: str, prev: dict[str, Any]) -> str:
    try:
        parsed = cni_result.create_result(version, prev)
    except cni_result.ResultError as exc:
        return f"PARSE {exc}"
    try:
        lifted = cni_result.convert(parsed, cni.IMPLEMENTED_VERSION)
    except cni_result.ResultError as exc:
        return f"CONVERT {exc}"
    try:
        return "OK " + cni_result.print_result(lifted, version).decode()
    except cni_result.ResultError as exc:
        return f"PRINT {exc}"


@pytest.fixture(scope="module")
def oracle() -> Path:
    return build_go(ORACLE_SOURCE, "result-oracle")


def test_results_agree_with_the_go_library(oracle: Path) -> None:
    """800 seeded prevResults under 0.x configs: same bytes or same error as Go."""
    rng = random.Random(7)
    cases = []
    for _ in range(800):
        version = rng.choice(CONFIG_VERSIONS)
        cases.append((version, prev_result(rng, version)))
    stdin = "".join(
        base64.b64encode(json.dumps({"version": v, "prev": p}).encode()).decode() + "\n"
        for v, p in cases
    )
    proc = subprocess.run([str(oracle)], input=stdin, capture_output=True, text=True, check=True)
    answers = [json.loads(line) for line in proc.stdout.splitlines()]
    assert len(answers) == len(cases)
    mismatches = [
        (case, mine, go)
        for case, go in zip(cases, answers, strict=True)
        if (mine := ours(*case)) != go
    ]
    assert not mismatches, "\n".join(f"{c}\n  ours: {m}\n  go:   {g}" for c, m, g in mismatches[:4])
    outcomes = {answer.split(" ", 1)[0] for answer in answers}
    assert {"OK", "PARSE", "PRINT"} <= outcomes  # successes and failures both exercised

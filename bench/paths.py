"""The bench's fixed paths and names (fixtures, results, netns names)."""

from __future__ import annotations

from pathlib import Path

from tests.support import FIXTURES

REPO = Path(__file__).resolve().parent.parent

SCENARIOS = FIXTURES / "derived" / "linkerd-iptables"
PREV_RESULT = (
    FIXTURES / "derived" / "reference-plugin-oracle" / "ptp-host-local-ADD-1.0.0.stdout.json"
)
GOLDEN = (
    FIXTURES
    / "upstream"
    / "linkerd2"
    / "inject-goldens"
    / ("inject_emojivoto_deployment_no_init_container.golden.yml")
)
UNMESHED_GOLDEN = GOLDEN.with_name("inject_emojivoto_deployment_overridden_noinject.golden.yml")
UNMESHED_NAME = "web-plain"  # the golden's pod renamed beside the meshed one
RESULTS = REPO / "bench" / "results"
NETNS_DIR = "/var/run/netns"
SAVE = {"nft": "iptables-nft-save", "legacy": "iptables-legacy-save"}
PREFIX = "cbxbench"

ONESHOT = "one-shot binary"

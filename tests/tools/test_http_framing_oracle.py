"""The framing table (tests/support/framing.py) checked against the real Go net/http client
(tests/support/framing_oracle.go, built with Debian's Go): for each framing, Go's first
request ends as the table says (status and body, or an error), its second request
succeeds, and it used as many connections as the table says. The table is what
tests/pure/test_http_framing.py holds cnibox's client to, so cnibox follows Go. Cost:
about 10 s after the build.
"""

from __future__ import annotations

import json
import subprocess
from pathlib import Path

import pytest

from tests.support.framing import FRAMINGS, Err, Framing, Ok, replay
from tests.support.libcni import build_go

SOURCE = Path(__file__).resolve().parents[1] / "support" / "framing_oracle.go"


@pytest.fixture(scope="module")
def oracle() -> Path:
    return build_go(SOURCE, "framing-oracle")


@pytest.mark.parametrize("framing", FRAMINGS, ids=lambda f: f.name)
def test_go_agrees(oracle: Path, framing: Framing) -> None:
    with replay(framing) as server:
        url = f"http://127.0.0.1:{server.port}/x"
        run = subprocess.run(
            [str(oracle), url], check=True, capture_output=True, text=True, timeout=20
        )
    first, second = (json.loads(line) for line in run.stdout.splitlines())
    expected = framing.go119 or framing.outcome
    if isinstance(expected, Ok):
        assert first == {"status": expected.status, "body": expected.body.decode(), "err": ""}
    else:
        assert isinstance(expected, Err)
        assert expected.text in first["err"], first
    assert second == {"status": 200, "body": "ok", "err": ""}
    assert server.connections == framing.connections

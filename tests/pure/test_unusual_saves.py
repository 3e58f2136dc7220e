"""`iptables-verify --input` on unusual saves (tests/support/unusual_saves.py, the table
and what each case must give): the verdict, the line that says why, and never a Python
internal (issue 29's third area)."""

from __future__ import annotations

from pathlib import Path

import pytest

from tests.pure.test_iptables_verify import run_inproc, write_json
from tests.support.plain import assert_plain
from tests.support.scenarios import netconf
from tests.support.unusual_saves import SAVES, Save


def test_the_list_is_long_enough() -> None:
    assert len(SAVES) >= 50
    assert len({s.name for s in SAVES}) == len(SAVES)


@pytest.mark.parametrize("save", SAVES, ids=lambda s: s.name)
def test_unusual_save(tmp_path: Path, save: Save) -> None:
    config = write_json(tmp_path, "conf.json", netconf("default-nft"))
    data = save.text.encode("utf-8", "surrogateescape")
    code, out, err = run_inproc(["--config", config, "--input", "-"], data)
    assert code == save.exit, out + err
    assert save.says in out + err
    assert_plain(out + err)
    assert len(out + err) < 20_000

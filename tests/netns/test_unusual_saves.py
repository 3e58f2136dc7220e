"""The unusual saves (tests/support/unusual_saves.py) against Debian's iptables-restore:
a text cnibox refuses as not a save (iptables-verify exit 2) is one iptables-legacy-restore
--test refuses too, and one it judges (0 or 1) is one restore reads. Each runs in a
throwaway netns (restore --test builds the tables there without committing)."""

from __future__ import annotations

import subprocess

import pytest

from tests.support import require_tool
from tests.support.rig import Rig
from tests.support.unusual_saves import SAVES, Save


@pytest.mark.parametrize("save", SAVES, ids=lambda s: s.name)
def test_restore_reads_what_verify_judges(rig: Rig, save: Save) -> None:
    ns = rig.netns()
    tool = require_tool("iptables-legacy-restore")
    proc = subprocess.run(
        ["ip", "netns", "exec", ns.name, tool, "--test"],
        input=save.text.encode("utf-8", "surrogateescape"),
        capture_output=True,
        timeout=60,
        check=False,
    )
    reads = save.restore_reads if save.restore_reads is not None else save.exit != 2
    assert (proc.returncode == 0) is reads, proc.stderr.decode(errors="replace")

"""The undo journal's record groups (core/installer/journal.py rule 1): bounded by the read
limit, in order, and decoded trusting nothing."""

from __future__ import annotations

import pytest

from multicall.core.installer import journal
from multicall.core.installer.journal import RECORD_LIMIT, Record
from multicall.core.limits import INSTALLER_FILE
from multicall.errors import ConfigError

NET = "/etc/cni/net.d"


def test_groups_never_exceed_the_read_limit_and_a_1mib_record_fits_alone() -> None:
    big = Record(f"{NET}/10-a.conf", b"x" * INSTALLER_FILE, 0o644, "")
    small = Record(f"{NET}/10-a.conflist", None, 0o644, "ab" * 32)
    records = [small, big, small, big, big] + [small] * 3000
    entries = [journal.encode_group_entry(r) for r in records]
    sizes = journal.group_sizes(entries)
    assert sum(sizes) == len(records)
    start = 0
    for size in sizes:
        data = journal.encode_group(entries[start : start + size])
        assert len(data) <= RECORD_LIMIT
        assert journal.decode_group(data, net_dir=NET) == tuple(records[start : start + size])
        start += size
    assert sizes[:2] == [3, 1]  # two 1 MiB configs' records never share a file


def test_group_names_order_and_are_never_config_names() -> None:
    assert journal.group_number(journal.group_name(7)) == 7
    assert journal.group_name(9) < journal.group_name(10)
    for name in ("10-a.conf", "group-", "group-1x", "group-١"):
        assert journal.group_number(name) is None


@pytest.mark.parametrize(
    "data",
    [
        b'{"version": 2, "records": []}',
        b'{"version": 3, "records": {}}',
        b'{"version": 3, "records": [{"path": "/etc/passwd", "original": null, "mode": 420,'
        b' "written": ""}]}',
        b'{"version": 3, "records": [{"path": "/etc/cni/net.d/a.conf", "original": "!",'
        b' "mode": 420, "written": ""}]}',
        b"[",
    ],
)
def test_a_bad_group_is_refused(data: bytes) -> None:
    with pytest.raises(ConfigError):
        journal.decode_group(data, net_dir=NET)

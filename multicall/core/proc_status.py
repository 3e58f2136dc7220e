"""What a node agent reads of a caller process: /proc/PID/status lines
(proc(5)), and the capability bits it compares. Pure: text in, values out; malformed or
missing fields are a ValueError naming the field, never a guess."""

from __future__ import annotations

from collections.abc import Iterable
from dataclasses import dataclass

# linux/capability.h bit numbers.
CAP_NET_ADMIN = 12
CAP_SYS_ADMIN = 21
CAP_NAMES = {CAP_NET_ADMIN: "CAP_NET_ADMIN", CAP_SYS_ADMIN: "CAP_SYS_ADMIN"}

# A status file is about 1.5 KiB; anything past this bound is not read.
MAX_STATUS = 64 << 10


@dataclass(frozen=True, slots=True)
class ProcStatus:
    """The fields of /proc/PID/status the agent's admission uses."""

    euid: int  # the effective uid: the second of the four on the Uid: line
    cap_eff: int  # the effective capability set, a bit mask


def parse_status(text: str) -> ProcStatus:
    fields: dict[str, str] = {}
    for line in text.splitlines():
        key, sep, value = line.partition(":")
        if sep and key in ("Uid", "CapEff") and key not in fields:
            fields[key] = value.strip()
    if "Uid" not in fields or "CapEff" not in fields:
        missing = sorted({"Uid", "CapEff"} - fields.keys())
        raise ValueError(f"status has no {', '.join(missing)} line")
    uids = fields["Uid"].split()
    if len(uids) != 4 or not all(u.isdecimal() for u in uids):
        raise ValueError("status: malformed Uid line")
    cap = fields["CapEff"]
    if not cap or len(cap) > 16 or any(c not in "0123456789abcdefABCDEF" for c in cap):
        raise ValueError("status: malformed CapEff line")
    return ProcStatus(int(uids[1]), int(cap, 16))


def missing_caps(cap_eff: int, needed: Iterable[int]) -> list[str]:
    """Names of the `needed` capabilities (bit numbers) not in the mask `cap_eff`."""
    return [CAP_NAMES.get(cap, f"capability {cap}") for cap in needed if not cap_eff >> cap & 1]

"""The standard `process_*` metrics kubert registers beside a controller's own (crate
`kubert-prometheus-process`: same names, help texts and units), read from /proc/self.

A value that cannot be read is left out of the exposition, as the Rust collector does.
"""

from __future__ import annotations

import contextlib
import os
import time
from dataclasses import dataclass

from multicall.core.openmetrics import Sample

START_WALL = time.time()
START_MONOTONIC = time.monotonic()


def process_samples() -> list[Sample]:
    samples = [
        Sample(
            "start_time",
            "Time that the process started (in seconds since the UNIX epoch).",
            "gauge",
            float(START_WALL),
            "seconds",
        ),
        Sample(
            "uptime",
            "Total time since the process started (in seconds)",
            "counter",
            time.monotonic() - START_MONOTONIC,
            "seconds",
        ),
    ]
    stat = proc_usage("self")
    if stat is None:
        return samples
    samples += [
        Sample(
            "cpu",
            "Total user and system CPU time spent in seconds",
            "counter",
            stat.cpu_seconds,
            "seconds",
        ),
        Sample(
            "virtual_memory", "Virtual memory size in bytes", "gauge", stat.virtual_bytes, "bytes"
        ),
        Sample(
            "resident_memory",
            "Resident memory size in bytes",
            "gauge",
            stat.resident_bytes,
            "bytes",
        ),
    ]
    with contextlib.suppress(OSError):
        samples.append(
            Sample(
                "open_fds",
                "Number of open file descriptors",
                "gauge",
                len(os.listdir("/proc/self/fd")),
            )
        )
    max_fds = _max_fds()
    if max_fds is not None:
        samples.append(
            Sample("max_fds", "Maximum number of open file descriptors", "gauge", max_fds)
        )
    octets = _ip_octets()
    if octets is not None:
        samples += [
            Sample(
                "network_receive",
                "Number of bytes received by the process over the network",
                "counter",
                octets[0],
                "bytes",
            ),
            Sample(
                "network_transmit",
                "Number of bytes sent by the process over the network",
                "counter",
                octets[1],
                "bytes",
            ),
        ]
    samples.append(Sample("threads", "Number of OS threads in the process.", "gauge", stat.threads))
    return samples


@dataclass(frozen=True, slots=True)
class Usage:
    """A process's figures from /proc/PID/stat."""

    ppid: int
    cpu_seconds: float  # user + system
    threads: int
    virtual_bytes: int
    resident_bytes: int


def proc_usage(pid: int | str) -> Usage | None:
    """/proc/`pid`/stat read (None: no such process, or unreadable); `pid` may be "self"."""
    try:
        with open(f"/proc/{pid}/stat", "rb") as f:
            fields = f.read().rsplit(b")", 1)[1].split()
        # fields[0] is the state (field 3 of proc(5)): utime is field 14, so index 11
        ticks = os.sysconf("SC_CLK_TCK")
        utime, stime = int(fields[11]), int(fields[12])
        return Usage(
            ppid=int(fields[1]),
            cpu_seconds=(utime + stime) * (1000 // ticks) / 1000,
            threads=int(fields[17]),
            virtual_bytes=int(fields[20]),
            resident_bytes=int(fields[21]) * os.sysconf("SC_PAGE_SIZE"),
        )
    except (OSError, IndexError, ValueError):
        return None


def _max_fds() -> int | None:
    import resource

    try:
        soft, hard = resource.getrlimit(resource.RLIMIT_NOFILE)
    except (OSError, ValueError):
        return None
    if soft != resource.RLIM_INFINITY:
        return soft
    return 0 if hard == resource.RLIM_INFINITY else hard


def _ip_octets() -> tuple[int, int] | None:
    """IpExt InOctets/OutOctets of the process's network namespace (/proc/self/net/netstat)."""
    try:
        with open("/proc/self/net/netstat", encoding="ascii") as f:
            lines = [line.split() for line in f if line.startswith("IpExt:")]
    except OSError:
        return None
    if len(lines) < 2:
        return None
    table = dict(zip(lines[0][1:], lines[1][1:], strict=False))
    try:
        return int(table["InOctets"]), int(table["OutOctets"])
    except (KeyError, ValueError):
        return None

"""`make bench`: pod-start cost of cnibox against upstream's approach, side by side.

Every case runs in throwaway network namespaces this script creates and removes; nothing
touches the machine's own network namespace. Speed is reported here, never asserted in tests.

Rows:
  upstream replay  the exact argv sequence upstream's Go plugin runs for a meshed pod with the
                   chart defaults (save, rule commands, save), each as
                   `nsenter --net=<netns> -- <argv>` with Debian's real binaries
  cnibox ADD       a full plugin invocation (stdin config with prevResult, the test API server
                   on loopback TLS), source mode and built binary, legacy and nft
  bare start       `cnibox --version` and `python3 -c pass`
  concurrency      N ADDs launched at once against N fresh netns
"""

from __future__ import annotations

import argparse
import json
import os
import platform
import statistics
import subprocess
import sys
import time
from collections.abc import Callable, Iterator
from contextlib import contextmanager
from dataclasses import asdict, dataclass, field
from pathlib import Path

REPO = Path(__file__).resolve().parent.parent
SHARED = Path(os.environ.get("CNIBOX_SHARED", REPO.parent / "shared"))
SCENARIOS = SHARED / "fixtures" / "derived" / "linkerd-iptables"
RESULTS = REPO / "bench" / "results"
_seq = iter(range(1_000_000))


@dataclass
class Row:
    name: str
    samples_ms: list[float] = field(default_factory=list)
    failures: int = 0
    note: str = ""

    @property
    def median(self) -> float:
        return statistics.median(self.samples_ms) if self.samples_ms else float("nan")

    @property
    def p99(self) -> float:
        if not self.samples_ms:
            return float("nan")
        ordered = sorted(self.samples_ms)
        return ordered[min(len(ordered) - 1, round(0.99 * (len(ordered) - 1)))]


def sh(argv: list[str], **kw: object) -> subprocess.CompletedProcess[bytes]:
    return subprocess.run(argv, capture_output=True, check=False, **kw)  # type: ignore[call-overload,no-any-return]


@contextmanager
def fresh_netns() -> Iterator[str]:
    name = f"cbxbench{os.getpid()}x{next(_seq)}"
    subprocess.run(["ip", "netns", "add", name], check=True)
    try:
        subprocess.run(["ip", "-n", name, "link", "set", "lo", "up"], check=True)
        yield f"/var/run/netns/{name}"
    finally:
        subprocess.run(["ip", "netns", "del", name], check=False)


def timed(fn: Callable[[], bool]) -> tuple[float, bool]:
    start = time.perf_counter()
    ok = fn()
    return (time.perf_counter() - start) * 1000, ok


def load_argv(scenario: str) -> list[list[str]]:
    lines = (SCENARIOS / f"{scenario}.argv.jsonl").read_text().splitlines()
    return [json.loads(line) for line in lines if line.strip()]


def upstream_replay(scenario: str, save_binary: str) -> Callable[[str], bool]:
    commands = [[save_binary, "-t", "nat"], *load_argv(scenario), [save_binary, "-t", "nat"]]

    def run(netns: str) -> bool:
        for argv in commands:
            if sh(["nsenter", f"--net={netns}", "--", *argv]).returncode != 0:
                return False
        return True

    return run


def measure_in_netns(name: str, fn: Callable[[str], bool], iterations: int) -> Row:
    row = Row(name)
    for _ in range(iterations):
        with fresh_netns() as netns:
            ms, ok = timed(lambda netns=netns: fn(netns))  # type: ignore[misc]
        row.samples_ms.append(ms)
        row.failures += 0 if ok else 1
    return row


def measure_command(name: str, argv: list[str], iterations: int) -> Row:
    row = Row(name)
    for _ in range(iterations):
        ms, ok = timed(lambda: sh(argv).returncode == 0)
        row.samples_ms.append(ms)
        row.failures += 0 if ok else 1
    return row


def format_table(rows: list[Row]) -> str:
    head = f"{'case':<44}{'n':>5}{'median ms':>12}{'p99 ms':>10}{'fail':>6}"
    lines = [head, "-" * len(head)]
    for r in rows:
        lines.append(
            f"{r.name:<44}{len(r.samples_ms):>5}{r.median:>12.1f}{r.p99:>10.1f}{r.failures:>6}"
        )
    return "\n".join(lines)


def machine() -> dict[str, str]:
    cpu = next(
        (
            line.split(":", 1)[1].strip()
            for line in Path("/proc/cpuinfo").read_text().splitlines()
            if line.startswith("model name")
        ),
        "unknown",
    )
    return {
        "cpu": cpu,
        "cores": str(os.cpu_count()),
        "kernel": platform.release(),
        "python": platform.python_version(),
    }


def save(rows: list[Row], ratios: dict[str, float], extra: dict[str, object]) -> Path:
    RESULTS.mkdir(parents=True, exist_ok=True)
    out = RESULTS / "latest.json"
    data = {
        "machine": machine(),
        "rows": [asdict(r) | {"median": r.median, "p99": r.p99} for r in rows],
        "ratios": ratios,
        **extra,
    }
    out.write_text(json.dumps(data, indent=2) + "\n")
    return out


def main() -> int:
    parser = argparse.ArgumentParser(
        description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter
    )
    parser.add_argument("-n", "--iterations", type=int, default=30)
    parser.add_argument("--binary", default=str(REPO / "dist" / "cnibox"))
    args = parser.parse_args()
    n = args.iterations
    rows = [
        measure_in_netns(
            "upstream replay, nft (nsenter + iptables-nft)",
            upstream_replay("default-nft", "iptables-nft-save"),
            n,
        ),
        measure_in_netns(
            "upstream replay, legacy (nsenter + iptables-legacy)",
            upstream_replay("default-legacy", "iptables-legacy-save"),
            n,
        ),
        measure_command("bare start: python3 -c pass", [sys.executable, "-c", "pass"], n),
    ]
    if Path(args.binary).exists():
        rows.append(measure_command("bare start: cnibox --version", [args.binary, "--version"], n))
    print(format_table(rows))
    print(f"results: {save(rows, {}, {})}")
    return 0


if __name__ == "__main__":
    sys.exit(main())

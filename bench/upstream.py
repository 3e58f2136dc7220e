"""Upstream's side: the replayed nsenter + iptables sequence, and single commands timed."""

from __future__ import annotations

import json
import subprocess
from collections.abc import Mapping

from bench.measure import Row
from bench.netns import Namespaces
from bench.paths import SAVE, SCENARIOS
from bench.spawn import Spawner

# ----------------------------------------------------------------------------- upstream rows


def load_argv(scenario: str) -> list[list[str]]:
    lines = (SCENARIOS / f"{scenario}.argv.jsonl").read_text().splitlines()
    return [json.loads(line) for line in lines if line.strip()]


def upstream_commands(mode: str) -> list[list[str]]:
    save = [SAVE[mode], "-t", "nat"]
    return [save, *load_argv(f"default-{mode}"), save]


def nat_table(netns: str, mode: str) -> str:
    """The pod's nat table as Debian's save tool prints it, without its comment lines."""
    proc = subprocess.run(
        ["nsenter", f"--net={netns}", "--", SAVE[mode], "-t", "nat"],
        capture_output=True,
        text=True,
        check=False,
    )
    return comparable_save(proc.stdout)


def comparable_save(text: str) -> str:
    return "".join(line + "\n" for line in text.splitlines() if line and line[0] != "#")


def golden_table(mode: str) -> str:
    return comparable_save((SCENARIOS / f"default-{mode}.iptables-save.txt").read_text())


# ----------------------------------------------------------------------------- other rows

# GNU time's last stderr line: the child's peak resident set in KiB.
TIME_RSS = ["/usr/bin/time", "-f", "%M"]


def parse_rss(stderr: bytes) -> int | None:
    lines = stderr.decode(errors="replace").strip().splitlines()
    return int(lines[-1]) if lines and lines[-1].isdigit() else None


def upstream_row(name: str, spawner: Spawner, namespaces: Namespaces, mode: str, n: int) -> Row:
    row = Row(name)
    for i in range(n + 1):
        # the uncounted first pass warms the page cache and modules, and measures memory
        total, cpu, ok, rss = replay_once(spawner, namespaces, mode, [] if i else TIME_RSS)
        if i:
            row.add(total, ok, cpu)
        else:
            row.peak_rss_kb = rss
    row.note = f"{len(upstream_commands(mode))} processes"
    return row


def replay_once(
    spawner: Spawner, namespaces: Namespaces, mode: str, wrap: list[str]
) -> tuple[float, float, bool, int]:
    """Upstream's command sequence once, on a fresh pod netns: (wall ms, CPU ms, table right,
    peak RSS KiB when `wrap` is TIME_RSS)."""
    env = {"PATH": "/usr/sbin:/usr/bin:/sbin:/bin"}
    total, cpu, ok, rss = 0.0, 0.0, True, 0
    with namespaces.fresh() as netns:
        for argv in upstream_commands(mode):
            done = spawner.run([*wrap, "nsenter", f"--net={netns}", "--", *argv], env)
            total += done.ms
            cpu += done.cpu_ms
            rss = max(rss, parse_rss(done.stderr) or 0) if wrap else 0
            ok = ok and done.status == 0
        ok = ok and nat_table(netns, mode) == golden_table(mode)
    return total, cpu, ok, rss


def command_row(
    name: str, spawner: Spawner, argv: list[str], n: int, env: Mapping[str, str]
) -> Row:
    row = Row(name)
    row.peak_rss_kb = parse_rss(spawner.run([*TIME_RSS, *argv], env).stderr)
    for _ in range(n):
        done = spawner.run(argv, env)
        row.add(done.ms, done.status == 0, done.cpu_ms)
    return row

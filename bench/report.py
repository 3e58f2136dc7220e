"""Tables, ratios and the saved results."""

from __future__ import annotations

import json
import os
import platform
import statistics
from dataclasses import asdict
from pathlib import Path
from typing import Any

from bench.measure import Row
from bench.paths import ONESHOT, RESULTS

# ----------------------------------------------------------------------------- report


def format_table(rows: list[Row]) -> str:
    head = (
        f"{'case':<44}{'n':>4}{'median ms':>10}{'p99 ms':>9}{'cpu ms':>8}{'fail':>5}"
        f"{'RSS MiB':>8}  note"
    )
    lines = [head, "-" * len(head)]
    for r in rows:
        rss = r.peak_rss_kb / 1024 if r.peak_rss_kb else float("nan")
        cpu = statistics.median(r.cpu_ms) if r.cpu_ms else float("nan")
        lines.append(
            f"{r.name:<44}{len(r.samples_ms):>4}{r.median:>10.1f}{r.p99:>9.1f}{cpu:>8.1f}"
            f"{r.failures:>5}{rss:>8.1f}  {r.note}"
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
        "loadavg_at_end": loadavg(),
    }


def loadavg() -> str:
    """1, 5 and 15 minute load averages: the machine may be shared, read numbers with it."""
    return " ".join(Path("/proc/loadavg").read_text().split()[:3])


def ratio(rows: dict[str, Row], num: str, den: str, *, cpu: bool = False) -> float | None:
    """Median over median (wall time, or the children's CPU time)."""
    if num not in rows or den not in rows:
        return None
    top, bottom = rows[num], rows[den]
    if cpu:
        if not top.cpu_ms or not bottom.cpu_ms:
            return None
        return statistics.median(top.cpu_ms) / statistics.median(bottom.cpu_ms)
    return top.median / bottom.median if bottom.median > 0 else None


def ratios(rows: dict[str, Row], impl: str) -> dict[str, dict[str, Any]]:
    """The issue's three ratios, by wall time (the goal) and by CPU time (steadier when the
    machine is shared)."""
    out: dict[str, dict[str, Any]] = {}
    bare = (
        "bare start: python -m multicall --version"
        if impl == "source"
        else ("bare start: cnibox --version")
    )
    for mode in ("nft", "legacy"):
        add = f"cnibox ADD, {impl}, {mode}"
        for label, den, goal in (
            (f"cnibox {impl} ADD / upstream replay ({mode})", f"upstream replay, {mode}", 0.25),
            (f"cnibox {impl} ADD / bare start ({mode})", bare, 2.0),
        ):
            out[label] = {
                "value": ratio(rows, add, den),
                "cpu_value": ratio(rows, add, den, cpu=True),
                "goal": goal,
            }
    if impl == "binary":
        out.update(agent_ratios(rows))
    conc = rows.get(f"concurrency: {impl}, nft")
    if conc is not None and conc.samples_ms:
        out[f"concurrency p99 / p50 ({impl})"] = {
            "value": conc.p99 / conc.median,
            "cpu_value": None,
            "goal": 3.0,
        }
    return out


def agent_ratios(rows: dict[str, Row]) -> dict[str, dict[str, Any]]:
    """Issue 11's goals: the agent against upstream's replay, its burst against the one-shot
    burst, the first ADD after install against a warm one-shot ADD."""
    out: dict[str, dict[str, Any]] = {}
    pairs = (
        ("agent ADD / upstream replay (nft)", "cnibox ADD, agent, nft",
         "upstream replay, nft (interleaved with agent ADD)", 0.5),
        ("agent ADD / upstream replay (legacy)", "cnibox ADD, agent, legacy",
         "upstream replay, legacy (interleaved with agent ADD)", 0.5),
        ("agent unmeshed ADD / upstream replay (nft)", "cnibox ADD unmeshed, agent, nft",
         "upstream replay, nft (interleaved with agent ADD unmeshed)", 0.25),
        ("first ADD after install / warm one-shot (nft)", "cnibox ADD, binary after install, nft",
         "cnibox ADD, binary, nft", 1.5),
        ("one-shot binary ADD / upstream replay (nft)", "cnibox ADD, binary, nft",
         "upstream replay, nft", 1.5),
        ("one-shot binary ADD / replay, interleaved (nft)", f"cnibox ADD, {ONESHOT}, nft",
         f"upstream replay, nft (interleaved with {ONESHOT} ADD)", 1.5),
    )  # fmt: skip
    for label, num, den, goal in pairs:
        out[label] = {
            "value": ratio(rows, num, den),
            "cpu_value": ratio(rows, num, den, cpu=True),
            "goal": goal,
        }
    burst, alone = rows.get("concurrency: agent, nft"), rows.get("concurrency: binary, nft")
    if burst and alone and burst.wall_ms and alone.wall_ms:
        out["agent burst wall / one-shot burst wall (nft)"] = {
            "value": burst.wall_ms / alone.wall_ms,
            "cpu_value": None,
            "goal": 0.2,
        }
    return out


def format_ratios(values: dict[str, dict[str, Any]]) -> str:
    lines = [f"{'ratio':<52}{'wall':>6}{'cpu':>7}  goal"]
    for name, r in values.items():
        v, c = r["value"], r["cpu_value"]
        verdict = "n/a" if v is None else ("ok" if v <= r["goal"] else "MISSED")
        shown = "     -" if v is None else f"{v:6.2f}"
        shown_cpu = "      -" if c is None else f"{c:7.2f}"
        lines.append(f"{name:<52}{shown}{shown_cpu}  <= {r['goal']}  {verdict}")
    return "\n".join(lines)


def save(rows: list[Row], ratio_values: dict[str, Any], extra: dict[str, Any]) -> Path:
    RESULTS.mkdir(parents=True, exist_ok=True)
    out = RESULTS / "latest.json"
    data = {
        "machine": machine(),
        "rows": [asdict(r) | {"median": r.median, "p90": r.p90, "p99": r.p99} for r in rows],
        "ratios": ratio_values,
        **extra,
    }
    out.write_text(json.dumps(data, indent=2) + "\n")
    return out

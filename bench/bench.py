"""`make bench`: pod-start cost of cnibox against upstream's approach, side by side.

Every case runs in throwaway network namespaces this script creates and removes (also on
Ctrl-C, SIGTERM or an exception); nothing touches the machine's own network namespace: the
test Kubernetes API (tests/support/kubeapi.py) listens on 127.0.0.1 of a bench "node" netns, the
plugin runs in that node netns (like a runtime on the host) and programs a fresh pod netns.
Speed is reported here, never asserted in tests.

Rows:
  upstream replay  the exact argv sequence upstream's Go plugin runs for a meshed pod with the
                   chart defaults (save, rule commands, save), each as
                   `nsenter --net=<netns> -- <argv>` with Debian's real binaries
  cnibox ADD       a full plugin invocation as the container runtime makes it (CNI_* env,
                   chained config with prevResult on stdin, API server on loopback TLS):
                   source mode (`python -m multicall linkerd-cni`), the built binary through a
                   `linkerd-cni` symlink warm, and its first start after install (empty
                   CNIBOX_CACHE each time); legacy and nft
  agent ADD        the same invocation through the built file's launcher with `cnibox agent`
                   answering (docs/agent.md): meshed (nft, legacy) and unmeshed; the agent
                   runs in the node netns, as a DaemonSet pod with hostNetwork would
  after install    the first ADD of a new version when the installer unpacked it first
                   (CNIBOX_UNPACK_ONLY=1, untimed), no agent
  one-shot binary  the warm binary ADD again, each right after one upstream replay (the
                   issue-11 ratio of the one-shot path, both sides under the same load)
  bare start       `cnibox --version`, `python -m multicall --version`, `python3 -c pass`
  concurrency      N ADDs launched at once against N fresh netns (also through the agent)
  CRI sandbox      RunPodSandbox through Debian's containerd (the node of tests/cri, binary
                   plugin): bridge only vs bridge + linkerd-cni chained as the chart does,
                   one-shot and through the node agent, in alternating blocks of the same
                   run; the call's wall time (containerd makes the netns, starts the pause
                   container, runs the chain); p50/p90/p99 and the added latency's share
                   of bridge-only's (bench/cri_rows.py)

Each ADD is checked outside the timed region: exit status 0, stdout is the prevResult, and
the pod's nat table (Debian's iptables-save) equals upstream's golden for the mode.
`--profile` instead runs one source-mode ADD under `-X importtime` and cProfile; `--only
agent|oneshot` runs one group of interleaved rows with their ratios (a quick measurement of
one path); `--only native` the nftables mode against the nft mode (bench/native_rows.py);
`--only keeper` the keeper's rows (bench/keeper_rows.py: its idle CPU with --keeper-pods
watched pods, drift-to-repair latency, nft and legacy); `--only cache` the pod cache's
(bench/cache_rows.py: API requests per ADD with the cache on and off, interleaved; the whole
agent's CPU and memory with --keeper-pods watched pods, idle and while --churn-rate pods a
second are replaced for --churn-seconds).
"""

from __future__ import annotations

import argparse
import os
import signal
import sys
import tempfile
from pathlib import Path
from typing import Any

REPO = Path(__file__).resolve().parent.parent
sys.path.insert(0, str(REPO))  # before the imports below: bench/ is a package of REPO

from bench.agent_rows import agent_rows  # noqa: E402
from bench.cache_rows import cache_rows  # noqa: E402
from bench.cri_rows import add_cri_rows, report_cri  # noqa: E402
from bench.interleaved import oneshot_rows  # noqa: E402
from bench.keeper_rows import keeper_rows  # noqa: E402
from bench.measure import Row  # noqa: E402
from bench.native_rows import native_rows  # noqa: E402
from bench.netns import Namespaces, remove_stale  # noqa: E402
from bench.plugin_runs import Bench, Plugin, cluster  # noqa: E402
from bench.report import agent_ratios, format_ratios, format_table, loadavg, ratios, save  # noqa: E402
from bench.spawn import Spawner  # noqa: E402
from bench.upstream import command_row, upstream_row  # noqa: E402
from multicall.effects.ns import entered_netns  # noqa: E402

# ----------------------------------------------------------------------------- main


def plugins(workdir: Path, binary: Path | None) -> dict[str, Plugin]:
    found = {"source": Plugin("source", [sys.executable, "-m", "multicall", "linkerd-cni"])}
    if binary is None:
        return found
    links = workdir / "bin"
    links.mkdir()
    (links / "linkerd-cni").symlink_to(binary)
    warm = workdir / "cache-warm"
    warm.mkdir(mode=0o700)
    first = workdir / "cache-first"
    first.mkdir(mode=0o700)
    argv = [str(links / "linkerd-cni")]
    off = {"CNIBOX_AGENT_SOCKET": ""}  # never an agent that happens to run on this machine
    found["binary"] = Plugin("binary", argv, {"CNIBOX_CACHE": str(warm), **off})
    found["binary first start"] = Plugin("binary first start", argv, off, fresh_cache=first)
    return found


def run_bench(args: argparse.Namespace, spawner: Spawner, namespaces: Namespaces) -> int:
    n = args.iterations
    # resolved: the plugin is a symlink to it, and a relative target would dangle
    binary = Path(args.binary).resolve() if args.binary and Path(args.binary).exists() else None
    workdir = spawner.workdir
    env = {"PATH": "/usr/sbin:/usr/bin:/sbin:/bin"}
    rows: list[Row] = []
    extra: dict[str, Any] = {
        "iterations": n,
        "concurrency": args.concurrency,
        "loadavg_at_start": loadavg(),
    }

    def add(row: Row) -> None:
        rows.append(row)
        print(format_table([row]).splitlines()[-1], flush=True)

    print(format_table([]).splitlines()[0], flush=True)
    for mode in ("nft", "legacy"):
        add(upstream_row(f"upstream replay, {mode}", spawner, namespaces, mode, n))
    add(command_row("bare start: python3 -c pass", spawner, ["python3", "-c", "pass"], n, env))
    add(command_row("bare start: venv python -c pass", spawner,
                    [sys.executable, "-c", "pass"], n, env))  # fmt: skip
    add(
        command_row(
            "bare start: python -m multicall --version",
            spawner,
            [sys.executable, "-m", "multicall", "--version"],
            n,
            env,
        )
    )
    impls = plugins(workdir, binary)
    if binary is not None:
        cache = {"CNIBOX_CACHE": impls["binary"].env["CNIBOX_CACHE"], **env}
        add(
            command_row(
                "bare start: cnibox --version", spawner, [str(binary), "--version"], n, cache
            )
        )
        extra["binary"] = {"path": str(binary), "size_bytes": binary.stat().st_size}
    with cluster(namespaces, workdir) as cl:
        bench = Bench(spawner, namespaces, cl)
        for impl, plugin in impls.items():
            for mode in ("nft", "legacy"):
                add(bench.add_row(f"cnibox ADD, {impl}, {mode}", plugin, mode, n))
        for impl in ("source", "binary"):
            if impl in impls and args.concurrency:
                add(
                    bench.concurrency(
                        f"concurrency: {impl}, nft", impls[impl], "nft", args.concurrency
                    )
                )
        if binary is not None:
            extra["agent"] = agent_rows(bench, binary, impls, workdir, n, args.concurrency, add)
        extra["problems"] = bench.problems
    extra["problems"] += add_cri_rows(args.cri, binary, workdir, n, add)
    if binary is not None:
        extra["binary"]["extracted_bytes"] = _tree_size(Path(impls["binary"].env["CNIBOX_CACHE"]))
    by_name = {r.name: r for r in rows}
    ratio_values = {}
    for impl in ("binary", "source"):
        if impl in impls:
            ratio_values.update(ratios(by_name, impl))
    print()
    print(format_table(rows))
    print()
    print(format_ratios(ratio_values))
    report_cri(by_name, extra)
    if "binary" in extra:
        b = extra["binary"]
        print(
            f"\nbinary: {b['size_bytes'] / 2**20:.1f} MiB file, "
            f"{b['extracted_bytes'] / 2**20:.1f} MiB unpacked in CNIBOX_CACHE"
        )
    for problem in extra["problems"]:
        print(f"problem: {problem}")
    print(f"load average: {extra['loadavg_at_start']} at start, {loadavg()} at the end")
    print(f"results: {save(rows, ratio_values, extra)}")
    failures = sum(r.failures for r in rows)
    return 1 if failures else 0


ONLY = ("agent", "oneshot", "native", "keeper", "cache")


def run_only(args: argparse.Namespace, spawner: Spawner, namespaces: Namespaces) -> int:
    """`--only agent|oneshot`: one group of interleaved rows and their ratios, for measuring a
    change to one path quickly (the full run is `make bench`)."""
    binary = Path(args.binary).resolve() if Path(args.binary).exists() else None
    if binary is None:
        print("bench: --only needs the built binary (make build)", file=sys.stderr)
        return 2
    rows: list[Row] = []
    extra: dict[str, Any] = {"iterations": args.iterations, "loadavg_at_start": loadavg()}

    def add(row: Row) -> None:
        rows.append(row)
        print(format_table([row]).splitlines()[-1], flush=True)

    print(format_table([]).splitlines()[0], flush=True)
    impls = plugins(spawner.workdir, binary)
    with cluster(namespaces, spawner.workdir) as cl:
        bench = Bench(spawner, namespaces, cl)
        if args.only == "oneshot":
            oneshot_rows(bench, impls, args.iterations, add)
        elif args.only == "keeper":
            extra["keeper"] = keeper_rows(bench, binary, spawner.workdir, args.keeper_pods,
                                          args.iterations, args.keeper_windows, add)  # fmt: skip
        elif args.only == "cache":
            churn = (args.churn_rate, args.churn_seconds)
            extra["cache"] = cache_rows(bench, binary, spawner.workdir, args.iterations,
                                        args.keeper_pods, args.cache_idle_seconds, churn,
                                        add)  # fmt: skip
        elif args.only == "native":
            extra["native"] = native_rows(bench, binary, impls, spawner.workdir,
                                          args.iterations, add=add)  # fmt: skip
        else:
            extra["agent"] = agent_rows(bench, binary, impls, spawner.workdir, args.iterations,
                                        args.concurrency, add, oneshot=False)  # fmt: skip
        extra["problems"] = bench.problems
    ratio_values = agent_ratios({r.name: r for r in rows})
    print()
    print(format_table(rows))
    print()
    print(format_ratios({k: v for k, v in ratio_values.items() if v["value"] is not None}))
    for problem in extra["problems"]:
        print(f"problem: {problem}")
    print(f"load average: {extra['loadavg_at_start']} at start, {loadavg()} at the end")
    print(f"results: {save(rows, ratio_values, extra)}")
    return 1 if any(r.failures for r in rows) else 0


def run_cri_only(args: argparse.Namespace, workdir: Path) -> int:
    """`--cri-only`: the RunPodSandbox rows (bridge only, one-shot, agent) and their
    summary, nothing else."""
    rows: list[Row] = []
    extra: dict[str, Any] = {"iterations": args.iterations, "loadavg_at_start": loadavg()}
    binary = Path(args.binary).resolve() if Path(args.binary).exists() else None
    extra["problems"] = add_cri_rows(True, binary, workdir, args.iterations, rows.append)
    print(format_table(rows))
    report_cri({r.name: r for r in rows}, extra)
    for problem in extra["problems"]:
        print(f"problem: {problem}")
    print(f"load average: {extra['loadavg_at_start']} at start, {loadavg()} at the end")
    print(f"results: {save(rows, {}, extra)}")
    return 1 if not rows or any(r.failures for r in rows) else 0


def _tree_size(root: Path) -> int:
    return sum(p.lstat().st_size for p in root.rglob("*") if p.is_file() and not p.is_symlink())


def run_profile(
    spawner: Spawner, namespaces: Namespaces, mode: str, binary: Path | None, iterations: int
) -> int:
    """One source-mode ADD under `-X importtime`, cProfile and a dataclass counter, then the
    phases of an ADD (source and binary) timed without instrumentation."""
    import pstats

    impl = Plugin("source", [sys.executable, "-m", "multicall", "linkerd-cni"])
    prof = spawner.workdir / "add.prof"
    with cluster(namespaces, spawner.workdir) as cl:
        bench = Bench(spawner, namespaces, cl)
        with namespaces.fresh() as netns:
            bench.add_once(impl, mode, netns)
        runs = {
            "importtime": [sys.executable, "-X", "importtime", "-m", "multicall", "linkerd-cni"],
            "cprofile": [
                sys.executable,
                str(REPO / "bench" / "dcprof.py"),
                "--cprofile",
                str(prof),
                "linkerd-cni",
            ],
        }
        runs["dataclasses"] = [sys.executable, str(REPO / "bench" / "dcprof.py"), "linkerd-cni"]
        for what, argv in runs.items():
            with namespaces.fresh() as netns:
                done, ok = bench.add_once(Plugin(what, argv), mode, netns)
            print(f"== {what}: {done.ms:.1f} ms, verified: {ok}")
            if what == "importtime":
                print_importtime(done.stderr.decode())
            if what == "dataclasses":
                text = done.stderr.decode()
                print(text[text.find("dataclasses:") :])
        stats = pstats.Stats(str(prof))
        stats.sort_stats("cumulative").print_stats(25)
        stats.sort_stats("tottime").print_stats(15)
        rows = []
        for plugin in plugins(spawner.workdir, binary).values():
            rows += phases(bench, plugin, mode, iterations)
        print(format_table(rows))
        for problem in bench.problems:
            print(f"problem: {problem}")
    return 0


def phases(bench: Bench, plugin: Plugin, mode: str, n: int) -> list[Row]:
    """Where one ADD's time goes, without a profiler: the same invocation stopped earlier.

    VERSION: start-up, the dispatcher and the plugin module. ADD without pod args: plus config
    and prevResult handling (no API, no rules). ADD: plus the API GET and the rules.
    """
    cases = {
        "VERSION": {"CNI_COMMAND": "VERSION"},
        "ADD, no K8S_POD_* args": {"CNI_ARGS": "IgnoreUnknown=1"},
        "ADD": {},
    }
    rows = []
    for case, extra in cases.items():
        row = Row(f"{plugin.name}: {case}")
        variant = Plugin(plugin.name, plugin.argv, {**plugin.env, **extra}, plugin.fresh_cache)
        for _ in range(n + 1):
            with bench.namespaces.fresh() as netns:
                bench.seq += 1
                env = bench.cluster.env(netns, variant, bench.seq)
                stdin = bench.cluster.stdin(netns, mode)
                with entered_netns(bench.cluster.node):
                    done = bench.spawner.run(variant.argv, env, stdin)
                bench.drop_cache(variant, env)
            row.add(done.ms, done.status == 0, done.cpu_ms)
        row.samples_ms.pop(0)  # the first run warms caches
        row.cpu_ms.pop(0)
        rows.append(row)
    return rows


def print_importtime(stderr: str, top: int = 25) -> None:
    """`-X importtime` lines ("import time: self | cumulative | name"), largest first."""
    rows: list[tuple[int, int, str]] = []
    for line in stderr.splitlines():
        if line.startswith("import time:") and "self [us]" not in line:
            fields = line.removeprefix("import time:").split("|")
            rows.append((int(fields[1]), int(fields[0]), fields[2].rstrip()))
    total = sum(row[1] for row in rows)
    print(f"imports: {total / 1000:.1f} ms in total; largest cumulative (self):")
    for cum_us, self_us, module in sorted(rows, reverse=True)[:top]:
        print(f"  {cum_us / 1000:7.1f} ms ({self_us / 1000:5.1f})  {module}")


def executable_file(text: str) -> str:
    """--binary: made absolute, since the bench links plugin names to it from elsewhere (a
    relative target would dangle), and checked, so a typo is not a run without its rows."""
    path = Path(text).resolve()
    if not path.is_file() or not os.access(path, os.X_OK):
        raise argparse.ArgumentTypeError(
            f"{text}: not an executable file (`make build` builds dist/cnibox)"
        )
    return str(path)


def main() -> int:
    parser = argparse.ArgumentParser(
        description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter
    )
    parser.add_argument("-n", "--iterations", type=int, default=30)
    parser.add_argument("-c", "--concurrency", type=int, default=100)
    parser.add_argument(
        "--binary",
        type=executable_file,
        help="the built single file (default: dist/cnibox, its rows skipped if not built)",
    )
    parser.add_argument("--profile", choices=("nft", "legacy"), help="profile one source ADD")
    parser.add_argument(
        "--no-cri", dest="cri", action="store_false", help="skip the containerd RunPodSandbox rows"
    )
    parser.add_argument("--cri-only", action="store_true", help="only the RunPodSandbox rows")
    parser.add_argument(
        "--only",
        choices=ONLY,
        help="only one group of interleaved rows: the meshed and unmeshed ADDs through the "
        "agent, or the one-shot binary ADD, each with its replay (issue 11; no burst unless "
        "-c); or native: the nftables mode against the nft mode, one-shot and agent (issue 28); "
        "or keeper: the keeper's rows (issue 26: idle cost, drift to repair, -n repairs per mode); "
        "or cache: the pod cache's (issue 26: API requests per ADD, cache on and off, -n ADDs "
        "each; the agent's CPU and memory idle and under churn)",
    )
    parser.add_argument("--keeper-pods", type=int, default=100, help="pods the keeper watches")
    parser.add_argument(
        "--keeper-windows", type=int, default=6, help="10 s idle windows the keeper is measured"
    )
    parser.add_argument(
        "--cache-idle-seconds", type=int, default=20, help="--only cache: idle seconds measured"
    )
    parser.add_argument(
        "--churn-rate", type=float, default=5.0, help="--only cache: pods replaced per second"
    )
    parser.add_argument(
        "--churn-seconds", type=int, default=30, help="--only cache: seconds of churn"
    )
    args = parser.parse_args()
    args.binary = args.binary or str(REPO / "dist" / "cnibox")
    if os.geteuid() != 0:
        print("bench: needs root (network namespaces)", file=sys.stderr)
        return 2
    signal.signal(signal.SIGTERM, _terminate)
    # Even when started with SIGINT ignored (a background job): Ctrl-C must clean up.
    signal.signal(signal.SIGINT, signal.default_int_handler)
    remove_stale()
    namespaces = Namespaces()
    with tempfile.TemporaryDirectory(prefix="cnibox-bench-") as tmp:
        spawner = Spawner(Path(tmp))
        try:
            if args.profile:
                binary = Path(args.binary) if Path(args.binary).exists() else None
                return run_profile(spawner, namespaces, args.profile, binary, args.iterations)
            if args.cri_only:
                return run_cri_only(args, spawner.workdir)
            if args.only:
                return run_only(args, spawner, namespaces)
            return run_bench(args, spawner, namespaces)
        finally:
            spawner.kill_all()
            namespaces.remove_all()


def _terminate(signum: int, frame: object) -> None:
    raise SystemExit(128 + signum)


if __name__ == "__main__":
    try:
        sys.exit(main())
    except KeyboardInterrupt:
        print("bench: interrupted; every netns it made is removed", file=sys.stderr)
        sys.exit(130)

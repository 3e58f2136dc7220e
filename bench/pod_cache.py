"""The pod cache's costs in the agent's parent (docs/pod-cache.md), from source, no root:
how long the parent's loop spends on one feed line and on one worker's question, a question's
round trip over a control socket, and the memory of the cache with a node's worth of pods.

    python -m bench.pod_cache [--pods N] [--questions N]

Prints one JSON object. The pods are upstream's injected emojivoto golden (linkerd-proxy,
linkerd-network-validator and the injector's annotations) under distinct names and UIDs.
"""

from __future__ import annotations

import argparse
import copy
import json
import socket
import statistics
import sys
import threading
import time
import tracemalloc
from pathlib import Path
from typing import Any

REPO = Path(__file__).resolve().parent.parent
sys.path.insert(
    0, str(REPO)
)  # before the imports below: run as a script, bench/ is a package of REPO

from bench.paths import GOLDEN  # noqa: E402
from multicall.agent.pod_cache import CacheFeed, ask_parent  # noqa: E402
from multicall.core.kube.pod_cache import (  # noqa: E402
    MAX_PODS,
    NAMESPACES,
    PODS,
    PodCache,
    cluster_identity,
    reduce_pod,
)
from tests.support.kubeapi import pods_from_golden  # noqa: E402

CLUSTER = cluster_identity("10.96.0.1:443", "https", "", "PEM")


def pods(count: int) -> list[dict[str, Any]]:
    golden = pods_from_golden(GOLDEN)[0]
    out = []
    for i in range(count):
        pod = copy.deepcopy(golden)
        pod["metadata"].update(name=f"web-{i}", uid=f"00000000-0000-0000-0000-{i:012d}")
        pod["metadata"]["resourceVersion"] = str(1000 + i)
        pod["spec"]["nodeName"] = "node-a"
        out.append(pod)
    return out


def feed_lines(objects: list[dict[str, Any]]) -> list[bytes]:
    """The lines the cache process writes: records already reduced there."""
    messages: list[dict[str, Any]] = [{"k": "cluster", "id": CLUSTER}]
    records = [reduce_pod(o) for o in objects]
    for watch, items in ((PODS, records), (NAMESPACES, [{"metadata": {"name": "emojivoto"}}])):
        messages.append({"k": "init", "w": watch})
        messages += [{"k": "put", "w": watch, "o": o} for o in items]
        messages.append({"k": "done", "w": watch})
    return [json.dumps(m, separators=(",", ":")).encode() for m in messages]


def main() -> None:
    parser = argparse.ArgumentParser()
    parser.add_argument("--pods", type=int, default=110)  # the kubelet's default --max-pods
    parser.add_argument("--questions", type=int, default=20_000)
    args = parser.parse_args()
    objects = pods(args.pods)
    lines = feed_lines(objects)

    cache = PodCache()
    started = time.perf_counter()
    for line in lines:
        cache.feed(json.loads(line), 0.0)
    feed_us = (time.perf_counter() - started) / len(lines) * 1e6

    feed = CacheFeed(-1)
    feed.cache = cache
    questions = [
        json.dumps({"what": "pod", "ns": p["metadata"]["namespace"], "name": p["metadata"]["name"],
                    "uid": p["metadata"]["uid"], "cluster": CLUSTER, "n": 1}).encode()
        for p in objects
    ]  # fmt: skip
    started = time.perf_counter()
    for i in range(args.questions):
        answer = feed.answer(questions[i % len(questions)], 0.0)
    answer_us = (time.perf_counter() - started) / args.questions * 1e6
    assert b'"doc"' in answer

    # A question's round trip: the worker's side in this thread, the parent's in another.
    worker, parent = socket.socketpair(socket.AF_UNIX, socket.SOCK_SEQPACKET)
    stop = threading.Event()

    def parent_loop() -> None:
        while not stop.is_set():
            msg = parent.recv(65536)
            if not msg:
                return
            parent.send(feed.answer(msg[1:], 0.0))

    thread = threading.Thread(target=parent_loop, daemon=True)
    thread.start()
    question = json.loads(questions[0])
    trips = []
    for n in range(2000):
        started = time.perf_counter()
        assert ask_parent(worker, question, n) is not None
        trips.append((time.perf_counter() - started) * 1e6)
    stop.set()
    worker.close()
    thread.join(2)
    parent.close()

    def memory(count: int) -> int:
        tracemalloc.start()
        filled = PodCache()
        for line in feed_lines(pods(count)):
            filled.feed(json.loads(line), 0.0)
        size, _peak = tracemalloc.get_traced_memory()
        tracemalloc.stop()
        del filled
        return size

    trips.sort()
    print(json.dumps({
        "pods": args.pods,
        "record_bytes": cache.stores[PODS].size // max(1, len(cache.stores[PODS].objects)),
        "feed_line_us": round(feed_us, 2),
        "answer_us": round(answer_us, 2),
        "ask_round_trip_us": {"p50": round(statistics.median(trips), 1),
                              "p99": round(trips[int(len(trips) * 0.99)], 1)},
        "memory_bytes": {"110 pods": memory(110), f"{MAX_PODS} pods": memory(MAX_PODS)},
    }, indent=2))  # fmt: skip


if __name__ == "__main__":
    main()

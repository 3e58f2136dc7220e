"""The node readiness gate (docs/node-readiness.md): a thread beside the installer's watch
that checks, in rounds, whether this node can program a pod end to end, keeps the
`LinkerdCNIReady` condition saying so, and removes the startup taint when it can (puts it
back while it cannot, when configured).

Rules of this module:
1. One round: the plugin file, the chain read back, the API with the plugin's kubeconfig,
   the agent (when configured), then the self-test; the self-test runs again only when what
   it tested changed (the plugin file, the config's bytes) or after it failed.
2. Writes go through the service account (in-cluster config, rotating token): the taint by
   a JSON patch that tests the list as read, retried on 409/422 after a fresh read, at most
   MAX_ATTEMPTS times a round; the condition by a strategic merge patch on status.
3. Nothing here raises into the installer: an API failure is logged once per kind of
   failure and the next round tries again. The installer's own behaviour never changes.
4. Durations (installer start to chain ready, to taint removed, each self-test) and the
   self-tests' results are log lines and go into `metrics` (core/installer/metrics.py), which
   install-cni's admin server serves on `/metrics` (its applet wires the two).
"""

from __future__ import annotations

import os
import threading
import time
from collections.abc import Mapping, Sequence
from datetime import UTC, datetime

from multicall.core import node_gate
from multicall.core.installer.config import InstallerConfig
from multicall.core.installer.metrics import GateMetrics
from multicall.core.kube import paths
from multicall.core.node_gate import CheckResult, GateConfig, Verdict
from multicall.effects.kube.stream import (
    ClientOptions,
    Response,
    Session,
    StatusError,
    Token,
    in_cluster_config,
)
from multicall.effects.log import Logger
from multicall.errors import CniboxError, KubeError
from multicall.gate import checks
from multicall.gate.selftest import run_selftest

API_TIMEOUT = 5.0
MAX_ATTEMPTS = 5
CONFLICT = (409, 422)  # 422: a `test` op failed (the list changed since the read)


class Gate:
    def __init__(
        self,
        config: GateConfig,
        installer: InstallerConfig,
        env: Mapping[str, str],
        log: Logger,
        metrics: GateMetrics | None = None,
    ) -> None:
        self.config = config
        self.metrics = metrics if metrics is not None else GateMetrics()
        self.metrics.enabled = True
        self.installer = installer
        self.env = env
        self.log = log
        self.started = time.monotonic()
        self.stopping = threading.Event()
        self.thread: threading.Thread | None = None
        self.session: Session | None = None
        self.selftest_key: tuple[object, ...] | None = None  # what the last good self-test saw
        self.chain_ready_at: float | None = None
        self.untainted_at: float | None = None
        self.last_error = ""

    # --- lifecycle -------------------------------------------------------------------------

    def start(self) -> None:
        self.thread = threading.Thread(target=self._loop, name="node-gate", daemon=True)
        self.thread.start()

    def stop(self) -> None:
        self.stopping.set()
        if self.session is not None:
            self.session.abort()
        if self.thread is not None:
            self.thread.join(API_TIMEOUT * 2)
        self.close()

    def close(self) -> None:
        if self.session is not None:
            self.session.close()

    def _loop(self) -> None:
        self.log.info(
            f"node gate: node {self.config.node}, taint {self.config.taint.key}:"
            f"{self.config.taint.effect}, condition {node_gate.CONDITION_TYPE}"
        )
        while not self.stopping.is_set():
            try:
                verdict = self.round()
            except Exception as exc:  # noqa: BLE001 - rule 3: a bug here must not end the installer
                self._once(f"node gate: round failed: {type(exc).__name__}: {exc}")
                verdict = None
            else:
                self.last_error = ""
            wait = (
                self.config.interval if verdict is not None and verdict.ready else self.config.retry
            )
            self.stopping.wait(wait)

    # --- one round -------------------------------------------------------------------------

    def verdict(self) -> Verdict:
        results: list[CheckResult] = []
        plugin_ok, plugin = checks.check_plugin(self.installer)
        results.append(plugin_ok)
        chain_ok, chain = checks.read_chain(self.installer)
        results.append(chain_ok)
        results.append(
            checks.check_api(self.installer, self.config.node, API_TIMEOUT)
            if chain_ok.ok
            else CheckResult("APIReachable", False, "not checked: no chain yet")
        )
        if self.config.agent_socket:
            results.append(checks.check_agent(self.config.agent_socket))
        if all(r.ok for r in results) and self.chain_ready_at is None:
            self.chain_ready_at = time.monotonic()
            self.metrics.chain_ready_seconds = self.chain_ready_at - self.started
            self.log.info(
                f"node gate: chain ready {self.chain_ready_at - self.started:.3f}s after start"
            )
        if not self.config.selftest:
            return Verdict(tuple(results))
        if not all(r.ok for r in results) or chain is None or chain.linkerd is None:
            self.selftest_key = None
            return Verdict((*results, CheckResult("SelfTest", False, "not run: a check failed")))
        key = (_identity(plugin), chain.digest, self.config.agent_socket)
        if key != self.selftest_key:
            outcome = run_selftest(plugin, self.installer.host_bin_dir, chain.linkerd, self.env)
            self.metrics.selftest(outcome.ok, outcome.seconds)
            self.log.info(
                f"node gate: self-test {'passed' if outcome.ok else 'failed'} in "
                f"{outcome.seconds:.3f}s" + (f": {outcome.detail}" if outcome.detail else "")
            )
            if not outcome.ok:
                self.selftest_key = None
                return Verdict((*results, CheckResult("SelfTest", False, outcome.detail)))
            self.selftest_key = key
        return Verdict((*results, CheckResult("SelfTest", True)))

    def round(self) -> Verdict:
        verdict = self.verdict()
        self.metrics.ready = verdict.ready
        node = self.read_node()
        self.write_condition(verdict, node)
        if verdict.ready:
            if self.change_taint(remove=True) and self.untainted_at is None:
                self.untainted_at = time.monotonic()
                self.metrics.taint_removed_seconds = self.untainted_at - self.started
                self.log.info(
                    f"node gate: taint {self.config.taint.key} removed "
                    f"{self.untainted_at - self.started:.3f}s after start"
                )
        elif self.config.reapply:
            self.change_taint(remove=False)
        return verdict

    # --- the API ---------------------------------------------------------------------------

    def _session(self) -> Session:
        if self.session is None:
            kube = in_cluster_config(self.env)
            self.session = Session(kube, Token(kube), ClientOptions(headers_timeout=API_TIMEOUT))
        return self.session

    def request(
        self, method: str, path: str, body: object = None, content_type: str = ""
    ) -> Response:
        payload = body if isinstance(body, (Mapping, Sequence)) else None
        return self._session().request(
            method,
            path,
            body=payload,
            timeout=API_TIMEOUT,
            content_type=content_type or "application/json",
        )

    def read_node(self) -> Mapping[str, object]:
        path = paths.node(self.config.node)
        answer = self.request("GET", path)
        if answer.status != 200:
            raise StatusError(answer.status, answer.body, path)
        return answer.json()

    def write_condition(self, verdict: Verdict, node: Mapping[str, object]) -> None:
        patch = node_gate.condition_patch(verdict, node_gate.condition_of(node), _now())
        if patch is None:
            return
        self._patch_status(patch)
        self.log.info(
            f"node gate: {node_gate.CONDITION_TYPE}={'True' if verdict.ready else 'False'} "
            f"({verdict.reason}): {verdict.message}"
        )

    def remove_condition(self) -> None:
        self._patch_status(node_gate.remove_condition_patch())

    def _patch_status(self, patch: Mapping[str, object]) -> None:
        path = paths.node_status(self.config.node)
        for _attempt in range(MAX_ATTEMPTS):
            # no precondition in this patch: a 409 is the server's own race, worth a retry
            answer = self.request("PATCH", path, patch, node_gate.STRATEGIC_MERGE_PATCH)
            if answer.status != 409:
                break
        if answer.status >= 300:
            raise StatusError(answer.status, answer.body, path, "patch")

    def change_taint(self, *, remove: bool) -> bool:
        """Remove (or add) our taint; True when this call changed the node. Conflicts are
        retried on a fresh read (rule 2)."""
        path = paths.node(self.config.node)
        make = node_gate.remove_taint_patch if remove else node_gate.add_taint_patch
        for _attempt in range(MAX_ATTEMPTS):
            patch = make(self.read_node(), self.config.taint)
            if patch is None:
                return False
            answer = self.request("PATCH", path, patch, node_gate.JSON_PATCH)
            if answer.status < 300:
                if not remove:
                    self.log.info(f"node gate: taint {self.config.taint.key} put back")
                return True
            if answer.status not in CONFLICT:
                raise StatusError(answer.status, answer.body, path, "patch")
            self.log.debug(f"node gate: taint patch conflicted (HTTP {answer.status}); re-reading")
        raise KubeError(f"node gate: the taints of {self.config.node} kept changing; next round")

    def uninstall(self) -> list[str]:
        """A deliberate uninstall: the node schedulable, our condition gone."""
        errors = []
        for step in (lambda: self.change_taint(remove=True), self.remove_condition):
            try:
                step()
            except CniboxError as exc:
                errors.append(exc.message)
        self.close()
        return errors

    def _once(self, message: str) -> None:
        if message != self.last_error:
            self.log.error(message)
            self.last_error = message
        if self.session is not None:
            self.session.close()


def _identity(path: str) -> tuple[int, int, int]:
    st = os.stat(path)
    return (st.st_ino, st.st_mtime_ns, st.st_size)


def _now() -> str:
    return datetime.now(UTC).strftime("%Y-%m-%dT%H:%M:%SZ")

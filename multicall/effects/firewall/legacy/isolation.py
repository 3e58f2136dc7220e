"""Where an x_tables operation runs (rule 3 of effects/firewall/legacy): in a forked child
that serves one family and dies (`run_isolated`), or in a single-use process itself
(`SingleUse`: a node agent's worker)."""

from __future__ import annotations

import contextlib
import io
import os
import pickle
import sys
from collections.abc import Callable
from typing import Any, NoReturn, TypeVar

from multicall.core.firewall.model import Family
from multicall.effects.firewall.legacy.dump import module_target_class
from multicall.effects.firewall.legacy.loading import iptc
from multicall.errors import FirewallConflict, FirewallError

T = TypeVar("T")


# ----------------------------------------------------------------------------- isolation


def run_isolated(work: Callable[[], T]) -> T:
    """Run `work` in a forked child (same netns, same thread state) and return its result.

    libxtables keeps one process-wide registry that registers an extension's IPv4 or IPv6
    half only for the family active at its first load, and it calls exit() on some errors.
    Each x_tables operation therefore runs in a child that serves one family and dies;
    the caller gets the value back, or the child's FirewallError, or a FirewallError
    saying how the child died.
    """
    iptc()  # import once in the parent; children share it copy-on-write
    _flush_std_streams()  # or the child (python-iptables flushes stdout) writes them twice
    read_end, write_end = os.pipe()
    pid = os.fork()
    if pid == 0:  # pragma: no cover - the child's coverage is not collected
        os.close(read_end)
        _child(work, write_end)
    os.close(write_end)
    with os.fdopen(read_end, "rb") as reader:
        data = reader.read()
    _, status = os.waitpid(pid, 0)
    value: T = _outcome(data, status)
    return value


# What a preload loads: the extensions of the PROXY_INIT rules (core/firewall/proxy_init.py).
PRELOAD_MATCHES = ("comment", "multiport", "owner", "tcp")
PRELOAD_TARGETS = ("REDIRECT",)
# The reason a request is handed back when this process holds the other family's extensions.
OTHER_FAMILY = "x_tables extensions of the other family loaded"


class SingleUse:
    """This process serves one request on one thread, then exits (a node agent's worker,
    forked from the warm agent): one-family operations run here (rule 3). Made once by that
    process and passed explicitly (plugin/ports.py `RealFirewall(single_use=)`), never for a
    long-lived or threaded process (the repair controller, the agent's parent).

    It records the family whose extensions libxtables holds in this process (loaded by an
    operation run here or by `preload`: for that family only) and the family of the
    operations that ran here (what its request needed). An exit() in libxtables ends this
    process and its one request only: the agent's caller sees the worker die and runs the
    one-shot path, where children keep that from reaching the plugin."""

    def __init__(self) -> None:
        self.family: Family | None = None  # whose extensions libxtables holds here
        self.ran: Family | None = None  # whose operations ran here
        _own_std_streams()  # python-iptables flushes sys.stdout: see there

    def preload(self, family: Family) -> None:
        """Before the request: load `family`'s extensions (dlopen and register, ~2 ms) so
        that a one-family apply of it does not pay for them. Enters no netns, opens no
        handle, touches no rule: python-iptables objects made without a table (libxtables
        asks the kernel for an extension's revisions, a read of what is registered
        globally). Any failure is swallowed: the request then loads what is missing, as
        without a preload. The other family is then handed back (rule 3)."""
        if self.family is not None:
            return
        try:
            module = iptc()
        except FirewallError:
            return  # nothing loaded: the request fails or succeeds as it would have
        self.family = family  # from the first dlopen on, libxtables holds this family
        with contextlib.suppress(Exception):
            rule = module.Rule() if family is Family.IPV4 else module.Rule6()
            for name in PRELOAD_MATCHES:
                rule.create_match(name)
            for name in PRELOAD_TARGETS:
                module_target_class()(rule, name)
            module.Target(rule, "RETURN")  # the standard target (verdicts and jumps)

    def run_here(self, family: Family, work: Callable[[], T]) -> T:
        """`work` (an x_tables operation on `family`) in this process; failures read as a
        child's would in `run_isolated`."""
        iptc()  # a FirewallError when libiptc cannot load, as run_isolated raises it
        self.family = self.ran = family
        try:
            return work()
        except FirewallError:
            raise
        except Exception as exc:  # worded as run_isolated words a crashed child
            raise FirewallError(f"libiptc worker failed: {str(exc) or 'no reason given'}") from exc


def extensions_loaded() -> int:
    """How many extensions python-iptables has loaded in this process (a worker reports
    how many its request loaded: none when the preload had them)."""
    xtables = sys.modules.get("iptc.xtables")
    loaded = getattr(xtables, "_loaded_exts", None)
    return len(loaded) if isinstance(loaded, dict) else 0


def _flush_std_streams() -> None:
    for stream in (sys.stdout, sys.stderr):
        with contextlib.suppress(AttributeError, OSError, ValueError):
            stream.flush()


def _child(work: Callable[[], object], write_end: int) -> NoReturn:  # pragma: no cover
    """Never returns into the caller's code: whatever happens, the child ends here."""
    try:
        _own_std_streams()
        _report(work, write_end)
    finally:
        os._exit(0)


def _own_std_streams() -> None:  # pragma: no cover - runs in the child
    """Give the child stream objects of its own. python-iptables flushes sys.stdout before
    each extension's save; in a threaded caller (the repair controller, whose logger writes
    to stdout) another thread may hold the stream's lock at the fork, and a lock held by a
    thread the child does not have is never released: the child would hang for ever."""
    for fd, name in ((1, "stdout"), (2, "stderr")):
        raw = io.FileIO(fd, "w", closefd=False)
        setattr(sys, name, io.TextIOWrapper(raw, errors="backslashreplace", write_through=True))


def _report(work: Callable[[], object], write_end: int) -> None:  # pragma: no cover
    try:
        result: tuple[str, object] = ("ok", work())
    except FirewallError as exc:
        kind = "conflict" if isinstance(exc, FirewallConflict) else "error"
        result = (kind, (exc.message, exc.details, exc.table))
    except Exception as exc:  # noqa: BLE001 - reported to the parent, which raises it
        result = ("crash", str(exc) or "no reason given")
    with contextlib.suppress(Exception), os.fdopen(write_end, "wb") as writer:
        writer.write(pickle.dumps(result))


def _outcome(data: bytes, status: int) -> Any:
    if not data:
        code = os.waitstatus_to_exitcode(status)
        raise FirewallError(f"libiptc worker died (status {code})")
    kind, value = pickle.loads(data)  # noqa: S301 - our own child, over our own pipe
    if kind == "ok":
        return value
    if kind in ("error", "conflict"):
        message, details, table = value
        error = FirewallConflict if kind == "conflict" else FirewallError
        raise error(message, details=details, table=table)
    raise FirewallError(f"libiptc worker failed: {value}")

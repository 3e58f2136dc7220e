"""The `legacy` firewall backend: x_tables through libiptc (python-iptables), in-process.

Rules of this module:
1. python-iptables is imported lazily, after `bundle.prepare_iptc()`, with its import-time
   side effects defused: no `modprobe` child, no `ldconfig`/`gcc` library search (libraries
   are looked up in the bundle and the usual directories only), no deprecation noise.
2. Its per-process caches are bypassed: a libiptc handle owns a socket of the netns it was
   opened in, so every call opens fresh handles in the current netns and closes them.
3. Each operation runs in a forked child (`run_isolated`): see there why. Except in a
   single-use process (a `SingleUse` passed in: a node agent's worker serves one request on
   one thread, then exits) with a backend made for one family (`sole`: an apply that
   touches that family only): there they run in the process itself (`SingleUse.run_here`),
   saving two forks of a large process per ADD. libxtables then holds that family's
   extensions, so the process hands any other family back (`errors.ServeElsewhere`, before
   anything changed: a child forked from it could not load that family's extensions).
   Such a process may load one family's extensions before its request arrives
   (`SingleUse.preload`: no handle, no netns, no rule), the same refusal then covers the
   other family.
4. `apply` edits one handle (create, flush, append) and commits once: the kernel swaps the
   whole table or nothing. Errors before the commit leave the table untouched.
   The engine holds the xtables lock (effects/firewall/locks.py) from the snapshot the change
   was planned from to the commit, as iptables holds it for one command. A writer that does
   not take the lock shows as a conflict instead of being overwritten: the handle no longer
   matches the snapshot (chains, rule counts), a chain to create exists or one to flush is
   gone, or the commit fails with EAGAIN (the kernel's table moved since the handle read it);
   each raises FirewallConflict and the engine plans again.
5. `dump` prints rules the way `iptables-legacy-save` does (`print_rule4`/`print_rule6` of
   iptables 1.8.9): address part in C order, then `-m NAME` plus each extension's own save
   output, then the target, tokenised into canonical `Rule.spec`s by the save-text lexer.
"""

from __future__ import annotations

import contextlib
import ctypes as ct
import errno as errno_mod
import io
import os
import pickle
import socket
import struct
import subprocess
import sys
import sysconfig
import types
import warnings
from collections.abc import Callable, Iterator
from functools import cache
from types import ModuleType
from typing import Any, NoReturn, TypeVar

from multicall.core.firewall.iptables_save import tokenize
from multicall.core.firewall.model import Family, Snapshot, TableChange
from multicall.core.firewall.protocols import XTABLES_NAMES
from multicall.core.firewall.ruleset import Chain, Counters, Rule, Table
from multicall.effects import bundle
from multicall.effects.ns import libc
from multicall.errors import FirewallConflict, FirewallError, ServeElsewhere

T = TypeVar("T")
NAME = "legacy"
STANDARD_VERDICTS = frozenset({"ACCEPT", "DROP", "QUEUE", "RETURN"})
LIB_DIRS = (
    "/usr/lib/x86_64-linux-gnu",
    "/lib/x86_64-linux-gnu",
    "/usr/lib/aarch64-linux-gnu",
    "/usr/lib64",
    "/usr/lib",
    "/lib",
)
TABLE_NAMES = {Family.IPV4: "/proc/net/ip_tables_names", Family.IPV6: "/proc/net/ip6_tables_names"}
IPT_F_GOTO = 0x02
IP6T_F_GOTO = 0x04
IPT_F_FRAG = 0x01
IPT_INV_FRAG = 0x20
INV_VIA_IN, INV_VIA_OUT, INV_SRC, INV_DST, INV_PROTO = 0x01, 0x02, 0x08, 0x10, 0x40


# ----------------------------------------------------------------------------- importing iptc


class _NoChild:
    """Stands in for subprocess.Popen while python-iptables imports (it runs modprobe)."""

    returncode = 0

    def __init__(self, *_args: object, **_kwargs: object) -> None:
        self.stderr = io.BytesIO()

    def wait(self) -> int:
        return 0


@cache
def iptc() -> ModuleType:
    """python-iptables, imported once without spawning anything."""
    bundle.prepare_iptc()
    _search_libraries_without_children()
    original = subprocess.Popen
    subprocess.Popen = _NoChild  # type: ignore[assignment,misc]  # see _NoChild
    stubbed = _stub_distutils()
    try:
        with warnings.catch_warnings():
            warnings.simplefilter("ignore")  # escape-sequence warnings of its sources
            import iptc as module
    except (OSError, ImportError, AttributeError) as exc:
        raise FirewallError(f"cannot load libiptc: {exc}", hint="is the bundle complete?") from exc
    finally:
        subprocess.Popen = original  # type: ignore[misc]  # restoring the real class
        for name in stubbed:
            sys.modules.pop(name, None)
    loaded: ModuleType = module
    return loaded


def _stub_distutils() -> tuple[str, ...]:
    """Give python-iptables the one distutils function it imports, for the import only.

    The real import goes through setuptools' distutils shim (half a second) or the
    deprecated stdlib package (absent from the bundle).
    """
    if "distutils" in sys.modules:
        return ()
    package = types.ModuleType("distutils")
    module = types.ModuleType("distutils.sysconfig")
    module.get_python_lib = lambda: sysconfig.get_path("purelib")  # type: ignore[attr-defined]
    package.sysconfig = module  # type: ignore[attr-defined]
    sys.modules["distutils"], sys.modules["distutils.sysconfig"] = package, module
    return ("distutils", "distutils.sysconfig")


def _search_libraries_without_children() -> None:
    """Replace ctypes.util.find_library (ldconfig, gcc, ld) by a directory search."""
    import ctypes.util

    previous: Callable[[str], str | None] = ctypes.util.find_library
    if getattr(previous, "cnibox_no_children", False):
        return

    def find_library(name: str) -> str | None:
        return "libc.so.6" if name == "c" else _find_in_dirs(name)

    find_library.cnibox_no_children = True  # type: ignore[attr-defined]  # marker attribute
    ctypes.util.find_library = find_library


def _find_in_dirs(name: str) -> str | None:
    dirs = [d for d in os.environ.get("IPTABLES_LIBDIR", "").split(":") if d] + list(LIB_DIRS)
    stem = name if name.startswith("lib") else f"lib{name}"
    for directory in dirs:
        found = [f for f in _listing(directory) if f.startswith(f"{stem}.so")]
        if found:
            # The soname (lib.so.N) first: python-iptables reads the ABI from the name.
            found.sort(key=lambda f: (f.count(".") != 2, f))
            return os.path.join(directory, found[0])
    return None


@cache
def _listing(directory: str) -> tuple[str, ...]:
    try:
        return tuple(os.listdir(directory))
    except OSError:
        return ()


# ----------------------------------------------------------------------------- handles


@contextlib.contextmanager
def opened(family: Family, table: str) -> Iterator[Any]:
    """A private libiptc handle on `table` in the current netns, freed on exit."""
    module = iptc()
    cls = module.Table if family is Family.IPV4 else module.Table6
    handle = object.__new__(cls)  # not Table(...): its cache outlives netns switches
    try:
        handle._init(table, False)
    except module.IPTCError as exc:
        raise FirewallError(f"{_tool(family)}: {exc}", table=table) from exc
    try:
        yield handle
    finally:
        handle.close()


def _tool(family: Family) -> str:
    return "iptables-legacy" if family is Family.IPV4 else "ip6tables-legacy"


# ----------------------------------------------------------------------------- dump


def _chain_names(handle: Any) -> list[str]:
    names = []
    name = handle._iptc.iptc_first_chain(handle._handle)
    while name:
        names.append(name.decode())
        name = handle._iptc.iptc_next_chain(handle._handle)
    return names


def _entries(handle: Any, chain: str) -> Iterator[Any]:
    entry = handle.first_rule(chain)
    while entry:
        yield entry
        entry = handle.next_rule(entry)


def _chain_header(handle: Any, name: str) -> Chain:
    if not handle.builtin_chain(name):
        return Chain(name)
    policy, (packets, octets) = handle.get_policy(name)
    return Chain(name, policy.name, Counters(packets, octets))


def dump_table(family: Family, table: str = "nat") -> Table:
    with opened(family, table) as handle:
        chains: list[Chain] = []
        rules: list[Rule] = []
        for name in _chain_names(handle):
            chains.append(_chain_header(handle, name))
            rules += [Rule(name, entry_spec(handle, e, family)) for e in _entries(handle, name)]
    return Table(table, tuple(chains), tuple(rules))


def entry_spec(handle: Any, entry: Any, family: Family) -> tuple[str, ...]:
    """The tokens `iptables-save` prints after `-A CHAIN` for one libiptc entry."""
    rule = _rule_for(entry, family)
    ip = rule.get_ip()
    tokens = _ip_part(ip, family)
    for match in _matches(rule, entry):
        tokens += ["-m", match.name, *split_saved(match._get_saved_buf(ip))]
    return (*tokens, *_target_part(handle, rule, entry, ip, family))


def _rule_for(entry: Any, family: Family) -> Any:
    module = iptc()
    rule = module.Rule() if family is Family.IPV4 else module.Rule6()
    rule.entry = entry
    return rule


def _matches(rule: Any, entry: Any) -> Iterator[Any]:
    module = iptc()
    xt_entry_match = module.xtables.xt_entry_match
    offset = 0
    start = rule._entry_size()
    while start + offset < entry.target_offset:
        raw = ct.cast(ct.byref(entry.elems, offset), ct.POINTER(xt_entry_match))[0]
        match = module.Match(rule, match=raw)
        yield match
        offset += match.size


def _target_part(handle: Any, rule: Any, entry: Any, ip: Any, family: Family) -> list[str]:
    module = iptc()
    raw = ct.cast(ct.byref(entry, entry.target_offset), ct.POINTER(module.xtables.xt_entry_target))
    name = raw[0].u.user.name.decode()
    verdict = handle.get_target(entry)
    verdict = verdict.decode() if isinstance(verdict, bytes) else (verdict or "")
    if name:
        target = _module_target_class()(rule, target=raw[0])
        return ["-j", target.name or verdict, *split_saved(target._get_saved_buf(ip))]
    if not verdict:
        return []
    goto = ip.flags & (IPT_F_GOTO if family is Family.IPV4 else IP6T_F_GOTO)
    return ["-g" if goto else "-j", verdict]


@cache
def _module_target_class() -> type:
    """A Target that never asks every table whether its name is a chain (it is a module)."""

    class ModuleTarget(iptc().Target):  # type: ignore[misc]  # python-iptables is untyped
        def _is_standard_target(self) -> bool:
            return False

    return ModuleTarget


def split_saved(raw: bytes | None) -> list[str]:
    """Tokens of an extension's save output (xtables_save_string quoting), split by the same
    lexer as save text (core/firewall/iptables_save.py `tokenize`)."""
    text = (raw or b"").decode().strip("\n")
    return [token.text for token in tokenize(text)]


# ----------------------------------------------------------------------------- address part


def _ip_part(ip: Any, family: Family) -> list[str]:
    if family is Family.IPV4:
        src = _ipv4(ip.src.s_addr, ip.smsk.s_addr, ip.invflags & INV_SRC, "-s")
        dst = _ipv4(ip.dst.s_addr, ip.dmsk.s_addr, ip.invflags & INV_DST, "-d")
    else:
        src = _ipv6(bytes(ip.src.s6_addr), bytes(ip.smsk.s6_addr), ip.invflags & INV_SRC, "-s")
        dst = _ipv6(bytes(ip.dst.s6_addr), bytes(ip.dmsk.s6_addr), ip.invflags & INV_DST, "-d")
    tokens = [*src, *dst]
    tokens += _iface(ip, "iniface", ip.invflags & INV_VIA_IN, "-i")
    tokens += _iface(ip, "outiface", ip.invflags & INV_VIA_OUT, "-o")
    tokens += _proto(ip.proto, ip.invflags & INV_PROTO)
    if family is Family.IPV4 and ip.flags & IPT_F_FRAG:
        tokens += ["!", "-f"] if ip.invflags & IPT_INV_FRAG else ["-f"]
    return tokens


def _invert(flag: int) -> list[str]:
    return ["!"] if flag else []


def _ipv4(addr: int, mask: int, inverted: int, option: str) -> list[str]:
    if not addr and not mask and not inverted:
        return []
    text = socket.inet_ntop(socket.AF_INET, struct.pack("I", addr))
    return [*_invert(inverted), option, f"{text}/{_v4_prefix(struct.pack('I', mask))}"]


def _v4_prefix(mask: bytes) -> str:
    bits = int.from_bytes(mask, "big")
    length = bin(bits).count("1")
    if bits == ((1 << 32) - 1) ^ ((1 << (32 - length)) - 1):
        return str(length)
    return socket.inet_ntop(socket.AF_INET, mask)


def _ipv6(addr: bytes, mask: bytes, inverted: int, option: str) -> list[str]:
    bits = int.from_bytes(mask, "big")
    length = bin(bits).count("1")
    contiguous = bits == ((1 << 128) - 1) ^ ((1 << (128 - length)) - 1)
    if contiguous and length == 0 and not inverted:
        return []
    prefix = str(length) if contiguous else socket.inet_ntop(socket.AF_INET6, mask)
    text = socket.inet_ntop(socket.AF_INET6, addr)
    return [*_invert(inverted), option, f"{text}/{prefix}"]


def _iface(ip: Any, field: str, inverted: int, option: str) -> list[str]:
    offset = getattr(type(ip), field).offset
    name = ct.string_at(ct.addressof(ip) + offset, 16)
    mask = ct.string_at(ct.addressof(ip) + offset + 32, 16)
    if mask[0] == 0:
        return []
    out = []
    for i in range(16):
        if mask[i] == 0:
            if name[i - 1] != 0:
                out.append("+")
            break
        if name[i] != 0:
            out.append(chr(name[i]))
    return [*_invert(inverted), option, "".join(out)]


class _Protoent(ct.Structure):
    _fields_ = (("p_name", ct.c_char_p), ("p_aliases", ct.c_void_p), ("p_proto", ct.c_int))


def _proto(number: int, inverted: int) -> list[str]:
    if not number:
        return []
    return [*_invert(inverted), "-p", protocol_name(number)]


@cache
def protocol_name(number: int) -> str:
    """As iptables: /etc/protocols through libc first, then xtables' own short list."""
    lookup = libc().getprotobynumber
    lookup.restype = ct.POINTER(_Protoent)
    entry = lookup(number)
    if entry and entry[0].p_name:
        return str(entry[0].p_name.decode())
    return XTABLES_NAMES.get(number, str(number))


# ----------------------------------------------------------------------------- apply


def apply_change(family: Family, change: TableChange, base: Snapshot | None = None) -> None:
    module = iptc()
    errors = (module.IPTCError, module.xtables.XTablesError, ValueError, AttributeError)
    with opened(family, change.table) as handle:
        if base is not None and not _handle_matches(handle, base):
            raise FirewallConflict(
                f"{_tool(family)}: the {change.table} table changed since it was read",
                table=change.table,
            )
        try:
            for name in change.create_chains:
                if handle.is_chain(name):
                    raise FirewallConflict(
                        f"{_tool(family)}: chain {name} appeared since the table was read",
                        table=change.table,
                    )
                handle.create_chain(name)
            for name in change.flush_chains:
                if not handle.is_chain(name):
                    raise FirewallConflict(
                        f"{_tool(family)}: chain {name} vanished since the table was read",
                        table=change.table,
                    )
                handle.flush_entries(name)
            for rule in change.append:
                handle.append_entry(rule.chain, encode_rule(handle, rule, family).rule)
        except errors as exc:
            raise FirewallError(f"{_tool(family)}: {exc}", table=change.table) from exc
        _commit(handle, family, change.table)


def _handle_matches(handle: Any, base: Snapshot) -> bool:
    """The handle holds the chains and per-chain rule counts of the snapshot."""
    names = _chain_names(handle)
    if set(names) != {c.name for c in base.table.chains}:
        return False
    return all(
        sum(1 for _ in _entries(handle, name)) == len(base.table.rules_of(name)) for name in names
    )


def _commit(handle: Any, family: Family, table: str) -> None:
    """One TC_COMMIT; EAGAIN means the kernel's table is no longer the one the handle read."""
    if handle._iptc.iptc_commit(handle._handle) == 1:
        return
    err = iptc().ip4tc._get_errno_loc()[0]  # read before any other call can clobber it
    text = handle._iptc.iptc_strerror(err)
    message = f"{_tool(family)}: can't commit: {text.decode() if isinstance(text, bytes) else text}"
    if err == errno_mod.EAGAIN:
        raise FirewallConflict(message, table=table, errno=err)
    raise FirewallError(message, table=table, errno=err)


def encode_rule(handle: Any, rule: Rule, family: Family) -> Any:
    """A python-iptables rule from canonical tokens (the forms `iptables-save` prints)."""
    module = iptc()
    out = module.Rule() if family is Family.IPV4 else module.Rule6()
    words = list(rule.spec)
    current: Any = None
    i, invert = 0, ""
    while i < len(words):
        if words[i] == "!":
            invert, i = "!", i + 1
            continue
        i, current = _feed(handle, out, current, words, i, invert=invert)
        invert = ""
    for match in out.matches:
        match._final_check()
    if out.target is None:
        out.target = module.Target(out, "")  # no -j: fall through
    out.target._final_check()
    return out


_ADDRESS_SETTERS = {
    "-s": "src",
    "-d": "dst",
    "-i": "in_interface",
    "-o": "out_interface",
    "-p": "protocol",
}


def _feed(handle: Any, out: Any, current: Any, words: list[str], i: int, *, invert: str) -> Any:
    """Consume one option at `i`; returns (next index, the match/target options go to)."""
    word = words[i]
    if word in _ADDRESS_SETTERS:
        setattr(out, _ADDRESS_SETTERS[word], invert + words[i + 1])
        return i + 2, current
    if word == "-f":
        out.fragment = not invert
        return i + 1, current
    if word == "-m":
        return i + 2, out.create_match(words[i + 1])
    if word in ("-j", "-g"):
        return i + 2, _make_target(handle, out, words[i + 1], goto=word == "-g")
    return _option(current, words, i, invert), current


def _option(current: Any, words: list[str], i: int, invert: str) -> int:
    """Feed `--name [value]` to the last match/target; returns the next index."""
    word = words[i]
    if current is None or not word.startswith("--"):
        raise ValueError(f"unexpected {word!r} in rule")
    value = ""
    following = words[i + 1] if i + 1 < len(words) else None
    if following is not None and not _starts_option(following):
        value, i = following, i + 1
    current.parse(word[2:], invert + value)
    return i + 1


def _starts_option(word: str) -> bool:
    return word == "!" or word.startswith("--") or word in ("-m", "-j", "-g")


def _make_target(handle: Any, rule: Any, name: str, *, goto: bool) -> Any:
    module = iptc()
    if name in STANDARD_VERDICTS:
        target = module.Target(rule, name, goto=goto)
    elif handle.is_chain(name):
        target = module.Target(rule, "", goto=goto)
        target.standard_target = name
    else:
        target = _module_target_class()(rule, name, goto=goto)
    rule.target = target
    return target


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
                _module_target_class()(rule, name)
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


# ----------------------------------------------------------------------------- backend


def tables_present(family: Family) -> tuple[str, ...]:
    """Tables x_tables has instantiated in this netns (without instantiating any)."""
    try:
        with open(TABLE_NAMES[family]) as names:
            return tuple(line.strip() for line in names if line.strip())
    except FileNotFoundError:
        return ()


def table_has_rules(family: Family, table: str) -> bool:
    with opened(family, table) as handle:
        for name in _chain_names(handle):
            if not handle.builtin_chain(name) or handle.first_rule(name):
                return True
    return False


class IptcBackend:
    """FirewallBackend for x_tables (what `iptables-legacy` programs). `sole`: the one family
    its user will touch in this process (an apply of one family), whose operations may then
    run in-process when this process is `single_use` (rule 3)."""

    def __init__(self, sole: Family | None = None, single_use: SingleUse | None = None) -> None:
        self.sole = sole
        self.single_use = single_use

    @property
    def name(self) -> str:
        return NAME

    def _run(self, family: Family, work: Callable[[], T]) -> T:
        single = self.single_use
        if single is None:
            return run_isolated(work)
        if single.family is not None and single.family is not family:
            # Neither here nor in a child forked from here: hand it back (rule 3). Raised
            # from a read (every apply plans all families first), so nothing changed yet.
            raise ServeElsewhere(OTHER_FAMILY)
        if family is self.sole:
            return single.run_here(family, work)
        return run_isolated(work)

    def dump(self, family: Family, table: str = "nat") -> Table:
        return self._run(family, lambda: dump_table(family, table))

    def snapshot(self, family: Family, table: str = "nat") -> Snapshot:
        dumped = self.dump(family, table)
        return Snapshot(dumped, None, frozenset(c.name for c in dumped.chains))

    def apply(self, family: Family, change: TableChange, base: Snapshot | None = None) -> None:
        self._run(family, lambda: apply_change(family, change, base))

    def has_rules(self, family: Family) -> bool:
        present = tables_present(family)
        return bool(present) and self._run(
            family, lambda: any(table_has_rules(family, t) for t in present)
        )

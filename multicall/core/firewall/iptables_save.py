"""Parse `iptables-save` / `ip6tables-save` text (and the restore subset tools write) into a
`Ruleset`.

Rules of this module:
1. Accepted: both flavours' headers and footers (`# ...` comments, skipped), iptables-nft's
   `# Warning: ...` lines (kept in `Ruleset.warnings`), `*table`, `:CHAIN POLICY [p:b]`,
   `-N CHAIN` (restore files), `[p:b] -A CHAIN ...` or `-A CHAIN ... -c p b`, `COMMIT`.
2. Rule tokens are split the way iptables-restore splits them (`add_param_to_argv`): a double
   quote opens a quoted run in which a backslash escapes the next character; the closing quote
   ends the token. So `xtables_save_string` output and `ruleset.render_spec` round-trip.
3. Specs are kept as written (canonicalisation is `canonical.py`'s job); chains and rules keep
   their line numbers.
4. Anything malformed raises `ConfigError` naming line, column and what was expected; no other
   exception escapes (the test suite fuzzes this).
"""

from __future__ import annotations

import re
from collections.abc import Callable
from dataclasses import dataclass, field

from multicall.core.firewall.ruleset import (
    BUILTIN_CHAINS,
    QUOTED_OPTIONS,
    Chain,
    Counters,
    Rule,
    Ruleset,
    Table,
)
from multicall.errors import ConfigError

WARNING_PREFIX = "# Warning:"
_WHITESPACE = " \t"
# A token: unquoted characters, optionally ending in a quoted run (the closing quote ends the
# token, as in iptables-restore), in which a backslash escapes the next character.
_TOKEN = re.compile(r'([^ \t"]*)"((?:[^"\\]|\\.)*)"|[^ \t"]+')
_ESCAPED = re.compile(r"\\(.)")
_TABLE_NAME = re.compile(r"[A-Za-z0-9_-]+\Z")
_POLICY = re.compile(r"(?:-|[A-Z]+)\Z")
_COUNTERS = re.compile(r"\[([0-9]{1,20}):([0-9]{1,20})\]\Z")
_NUMBER = re.compile(r"[0-9]{1,20}\Z")
_APPEND = frozenset({"-A", "--append"})
_NEW_CHAIN = frozenset({"-N", "--new-chain"})
_SET_COUNTERS = frozenset({"-c", "--set-counters"})

_Fail = Callable[[int, int, str], ConfigError]


@dataclass(frozen=True, slots=True)
class Token:
    text: str
    column: int  # 1-based


@dataclass(slots=True)
class _OpenTable:
    name: str
    line: int
    chains: list[Chain] = field(default_factory=list)
    rules: list[Rule] = field(default_factory=list)
    names: set[str] = field(default_factory=set)  # of `chains`; kube-proxy has thousands

    def knows(self, chain: str) -> bool:
        return chain in self.names or chain in BUILTIN_CHAINS.get(self.name, ())

    def close(self) -> Table:
        return Table(self.name, tuple(self.chains), tuple(self.rules))


class _Parser:
    def __init__(self, source: str | None) -> None:
        self.source = source
        self.tables: list[Table] = []
        self.warnings: list[str] = []
        self.open: _OpenTable | None = None

    def fail(self, line: int, column: int, message: str) -> ConfigError:
        where = f"line {line}, column {column}"
        prefix = f"{self.source}: {where}" if self.source else where
        return ConfigError(f"{prefix}: {message}", path=self.source)

    def feed(self, number: int, text: str) -> None:
        stripped = text.strip(_WHITESPACE)
        if not stripped:
            return
        column = len(text) - len(text.lstrip(_WHITESPACE)) + 1
        if stripped.startswith("#"):
            if stripped.startswith(WARNING_PREFIX):
                self.warnings.append(stripped)
            return
        if stripped.startswith("*"):
            self.start_table(number, column, stripped)
        elif self.open is None:
            raise self.fail(
                number, column, f"expected '*TABLE' or a '#' comment, found {_shown(stripped)}"
            )
        elif stripped.startswith(":"):
            self.declare_chain(number, column, stripped)
        elif stripped == "COMMIT":
            self.tables.append(self.open.close())
            self.open = None
        else:
            self.command(number, tokenize(text, line_number=number, fail=self.fail))

    def start_table(self, number: int, column: int, stripped: str) -> None:
        if self.open is not None:
            raise self.fail(
                number,
                column,
                f"expected COMMIT for table '{self.open.name}' (opened on line "
                f"{self.open.line}) before a new table",
            )
        words = stripped[1:].split()
        if not words or not _TABLE_NAME.match(words[0]):
            raise self.fail(number, column + 1, "expected a table name after '*'")
        if len(words) > 1:
            raise self.fail(number, column, f"expected end of line after '*{words[0]}'")
        self.open = _OpenTable(words[0], number)

    def declare_chain(self, number: int, column: int, stripped: str) -> None:
        assert self.open is not None
        words = stripped[1:].split()
        if not words:
            raise self.fail(number, column + 1, "expected a chain name after ':'")
        name = words[0]
        if len(words) < 2 or not _POLICY.match(words[1]):
            raise self.fail(
                number, column, f"expected a policy ('-' or e.g. ACCEPT) after ':{name}'"
            )
        if len(words) > 3:
            raise self.fail(number, column, "expected end of line after the counters")
        counters = None
        if len(words) == 3:
            counters = self.counters(number, column, words[2])
        policy = None if words[1] == "-" else words[1]
        builtin = name in BUILTIN_CHAINS.get(self.open.name, ())
        if policy is not None and not builtin:
            raise self.fail(number, column, f"expected '-' as policy of user chain '{name}'")
        self.add_chain(number, column, Chain(name, policy, counters, line=number))

    def counters(self, number: int, column: int, word: str) -> Counters:
        found = _COUNTERS.match(word)
        if not found:
            raise self.fail(number, column, f"expected counters '[packets:bytes]', found {word!r}")
        return Counters(int(found.group(1)), int(found.group(2)))

    def add_chain(self, number: int, column: int, chain: Chain) -> None:
        assert self.open is not None
        if chain.name in self.open.names:
            raise self.fail(number, column, f"chain '{chain.name}' is declared twice")
        self.open.chains.append(chain)
        self.open.names.add(chain.name)

    def command(self, number: int, tokens: list[Token]) -> None:
        assert self.open is not None
        counters = None
        first = tokens[0]
        if first.text.startswith("["):
            counters = self.counters(number, first.column, first.text)
            tokens = tokens[1:]
            if not tokens:
                raise self.fail(number, first.column, "expected '-A CHAIN' after the counters")
        verb = tokens[0]
        if verb.text in _NEW_CHAIN and counters is None:
            self.new_chain(number, tokens)
        elif verb.text in _APPEND:
            self.append(number, tokens, counters)
        else:
            raise self.fail(
                number,
                verb.column,
                f"expected ':CHAIN', '-A CHAIN', '-N CHAIN' or COMMIT, found {_shown(verb.text)}",
            )

    def new_chain(self, number: int, tokens: list[Token]) -> None:
        name = self.chain_name(number, tokens)
        if len(tokens) > 2:
            raise self.fail(number, tokens[2].column, f"expected end of line after '-N {name}'")
        self.add_chain(number, tokens[1].column, Chain(name, line=number))

    def chain_name(self, number: int, tokens: list[Token]) -> str:
        verb = tokens[0]
        if len(tokens) < 2 or not tokens[1].text or tokens[1].text[0] in "-!":
            column = tokens[1].column if len(tokens) > 1 else verb.column + len(verb.text)
            raise self.fail(number, column, f"expected a chain name after '{verb.text}'")
        return tokens[1].text

    def append(self, number: int, tokens: list[Token], counters: Counters | None) -> None:
        assert self.open is not None
        chain = self.chain_name(number, tokens)
        if not self.open.knows(chain):
            raise self.fail(
                number,
                tokens[1].column,
                f"expected a declared chain, but '{chain}' is not declared in table "
                f"'{self.open.name}'",
            )
        spec, inline = self.split_counters(number, tokens[2:])
        if inline is not None:
            if counters is not None:
                raise self.fail(number, tokens[0].column, "expected one set of counters, found two")
            counters = inline
        self.open.rules.append(Rule(chain, spec, counters, line=number))

    def split_counters(
        self, number: int, tokens: list[Token]
    ) -> tuple[tuple[str, ...], Counters | None]:
        """Remove `-c PACKETS BYTES` from a rule's tokens."""
        spec: list[str] = []
        counters = None
        i = 0
        while i < len(tokens):
            token = tokens[i]
            # `--comment -c` is a comment: the option takes the next word whatever it is.
            is_value = bool(spec) and spec[-1] in QUOTED_OPTIONS
            if token.text in _SET_COUNTERS and not is_value:
                values = [t.text for t in tokens[i + 1 : i + 3]]
                if counters is not None or len(values) < 2 or not all(map(_NUMBER.match, values)):
                    raise self.fail(
                        number, token.column, f"expected '{token.text} PACKETS BYTES' (once)"
                    )
                counters = Counters(int(values[0]), int(values[1]))
                i += 3
                continue
            spec.append(token.text)
            i += 1
        return tuple(spec), counters

    def finish(self, last_line: int) -> Ruleset:
        if self.open is not None:
            raise self.fail(
                last_line + 1,
                1,
                f"expected COMMIT for table '{self.open.name}' (opened on line "
                f"{self.open.line}) before the end of the input",
            )
        return Ruleset(tuple(self.tables), tuple(self.warnings))


def _shown(text: str, limit: int = 40) -> str:
    return repr(text if len(text) <= limit else text[:limit] + "...")


def tokenize(line: str, *, line_number: int = 1, fail: _Fail | None = None) -> list[Token]:
    """Split one rule line like iptables-restore does; columns are 1-based."""
    tokens: list[Token] = []
    end = 0
    for found in _TOKEN.finditer(line):
        _check_gap(line, end, found.start(), line_number, fail or _default_fail)
        quoted = found.group(2)
        text = found.group(0) if quoted is None else found.group(1) + _unescape(quoted)
        tokens.append(Token(text, found.start() + 1))
        end = found.end()
    _check_gap(line, end, len(line), line_number, fail or _default_fail)
    return tokens


def _check_gap(line: str, start: int, stop: int, line_number: int, fail: _Fail) -> None:
    """Between tokens only blanks are left, unless a quote was never closed."""
    quote = line.find('"', start, stop)
    if quote >= 0:
        raise fail(line_number, quote + 1, "expected a closing '\"' for the quote opened here")


def _unescape(text: str) -> str:
    return _ESCAPED.sub(r"\1", text) if "\\" in text else text


def _default_fail(line: int, column: int, message: str) -> ConfigError:
    return ConfigError(f"line {line}, column {column}: {message}")


def parse_save(text: str, *, source: str | None = None) -> Ruleset:
    """Parse save (or restore) text; `source` names the input in error messages."""
    parser = _Parser(source)
    lines = text.split("\n")
    if lines and lines[-1] == "":
        lines.pop()
    for number, raw in enumerate(lines, start=1):
        parser.feed(number, raw.removesuffix("\r"))
    return parser.finish(len(lines))


def last_table(ruleset: Ruleset, name: str) -> Table | None:
    """The last `name` table of a ruleset: concatenated dumps describe the latest state last."""
    found = [t for t in ruleset.tables if t.name == name]
    return found[-1] if found else None

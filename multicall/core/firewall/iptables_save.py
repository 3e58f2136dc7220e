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
   exception escapes (tests/pure/test_fuzz_parsers.py fuzzes this).
5. Lines can be fed one at a time (`read_last_table`): only the table asked for is kept, and
   only its rules a `keep_rule` predicate wants, so memory does not grow with the input
   (iptables-verify streams a 50 MB save this way; docs/hardening.md).
"""

from __future__ import annotations

import re
from collections.abc import Callable, Iterable, Mapping
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
MAX_WARNINGS = 64  # iptables-nft-save prints one or two; a flood of them is not kept
_WHITESPACE = " \t"
# A token: unquoted characters, optionally ending in a quoted run (the closing quote ends the
# token, as in iptables-restore), in which a backslash escapes the next character.
_TOKEN = re.compile(r'([^ \t"]*)"((?:[^"\\]|\\.)*)"|[^ \t"]+')
_WORD = re.compile(r'([^ \t"]*)"((?:[^"\\]|\\.)*)"|([^ \t"]+)')
# A line `_TOKEN` covers with blanks only between tokens (each token maybe ending in a closed
# quoted run). Possessive quantifiers: one way to match, so no backtracking blow-up.
_WELL_QUOTED = re.compile(r'[ \t]*+(?:(?:[^ \t"]*+"(?:[^"\\]|\\.)*+"|[^ \t"]++)[ \t]*+)*+')
_ESCAPED = re.compile(r"\\(.)")
_TABLE_NAME = re.compile(r"[A-Za-z0-9_-]+\Z")
_POLICY = re.compile(r"(?:-|[A-Z]+)\Z")
_COUNTERS = re.compile(r"\[([0-9]{1,20}):([0-9]{1,20})\]\Z")
_NUMBER = re.compile(r"[0-9]{1,20}\Z")
_APPEND = frozenset({"-A", "--append"})
_NEW_CHAIN = frozenset({"-N", "--new-chain"})
_SET_COUNTERS = frozenset({"-c", "--set-counters"})

_Fail = Callable[[int, int, str], ConfigError]
KeepRule = Callable[[Rule], bool]


@dataclass(frozen=True, slots=True)
class Token:
    """One word of a save-text line, with its column."""

    text: str
    column: int  # 1-based


@dataclass(slots=True)
class _OpenTable:
    """The table being parsed (between `*name` and COMMIT)."""

    name: str
    line: int
    kept: bool = True  # False: validated only, its chains and rules are not kept
    chains: list[Chain] = field(default_factory=list)
    rules: list[Rule] = field(default_factory=list)
    names: set[str] = field(default_factory=set)  # every declared chain; kube-proxy has thousands

    def knows(self, chain: str) -> bool:
        return chain in self.names or chain in BUILTIN_CHAINS.get(self.name, ())

    def close(self) -> Table:
        return Table(self.name, tuple(self.chains), tuple(self.rules))


class _Parser:
    def __init__(
        self,
        source: str | None,
        *,
        only: Mapping[str, KeepRule | None] | None = None,
    ) -> None:
        self.source = source
        # Keep only the last table of each of these names, and of it the rules its
        # predicate wants (None: all).
        self.only = only
        self.keep_rule: KeepRule | None = None
        self.tables: list[Table] = []
        self.warnings: list[str] = []
        self.open: _OpenTable | None = None
        self.words: dict[str, str] = {}

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
            if stripped.startswith(WARNING_PREFIX) and len(self.warnings) < MAX_WARNINGS:
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
            if self.open.kept:
                table = self.open.close()
                if self.only is not None:  # the last of each name only
                    self.tables = [t for t in self.tables if t.name != table.name]
                self.tables = [*self.tables, table]
            self.open = None
        elif not self.quick_command(number, text):
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
        self.open = _OpenTable(words[0], number, self.only is None or words[0] in self.only)
        self.keep_rule = None if self.only is None else self.only.get(words[0])

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
        if self.open.kept:
            self.open.chains.append(chain)
        self.open.names.add(chain.name)

    def keep(self, rule: Rule) -> None:
        assert self.open is not None
        if self.open.kept and (self.keep_rule is None or self.keep_rule(rule)):
            # A kube-proxy table repeats the same few words across 100 000s of rules: kept
            # rules share one string per distinct word.
            words = self.words
            spec = tuple([words.setdefault(word, word) for word in rule.spec])
            self.open.rules.append(Rule(rule.chain, spec, rule.counters, line=rule.line))

    def quick_command(self, number: int, text: str) -> bool:
        """A well-formed rule or `-N` line, taken without building tokens and columns (the
        bulk of a kube-proxy save); False when `command` must word an error."""
        assert self.open is not None
        words = _words(text)
        parsed = None if words is None else _quick_parse(words)
        if parsed is None:
            return False
        verb, chain, spec, counters = parsed
        if verb in _NEW_CHAIN:
            if chain in self.open.names:
                return False
            self.add_chain(number, 1, Chain(chain, line=number))
        elif self.open.knows(chain):
            self.keep(Rule(chain, spec, counters, line=number))
        else:
            return False
        return True

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
        self.keep(Rule(chain, spec, counters, line=number))

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


def _words(line: str) -> list[str] | None:
    """`tokenize` without columns; None when the line has an unclosed quote."""
    if '"' not in line:
        # iptables-restore splits on blanks only (not str.split's other whitespace).
        return [word for word in line.replace("\t", " ").split(" ") if word]
    if _WELL_QUOTED.fullmatch(line) is None:
        return None
    return [plain or before + _unescape(quoted) for before, quoted, plain in _WORD.findall(line)]


_Quick = tuple[str, str, tuple[str, ...], Counters | None]


def _quick_parse(words: list[str]) -> _Quick | None:
    """(verb, chain, spec, counters) of a valid `-N`/`-A` line; None for anything else."""
    counters = None
    if words[0].startswith("["):
        found = _COUNTERS.match(words[0])
        if found is None:
            return None
        counters = Counters(int(found.group(1)), int(found.group(2)))
        words = words[1:]
    if len(words) < 2 or not words[1] or words[1][0] in "-!":
        return None
    verb, chain = words[0], words[1]
    if verb in _NEW_CHAIN:
        valid = counters is None and len(words) == 2
        return (verb, chain, (), None) if valid else None
    split = _split_counters(words[2:]) if verb in _APPEND else None
    if split is None or (split[1] is not None and counters is not None):
        return None
    return verb, chain, split[0], split[1] or counters


def _split_counters(words: list[str]) -> tuple[tuple[str, ...], Counters | None] | None:
    """`split_counters` for plain words; None where it would raise (its message needs the
    columns only tokens have)."""
    if "-c" not in words and "--set-counters" not in words:
        return tuple(words), None
    spec: list[str] = []
    counters = None
    i = 0
    while i < len(words):
        word = words[i]
        if word in _SET_COUNTERS and not (spec and spec[-1] in QUOTED_OPTIONS):
            values = words[i + 1 : i + 3]
            if counters is not None or len(values) < 2 or not all(map(_NUMBER.match, values)):
                return None
            counters = Counters(int(values[0]), int(values[1]))
            i += 3
            continue
        spec.append(word)
        i += 1
    return tuple(spec), counters


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
    lines = text.split("\n")
    if lines and lines[-1] == "":
        lines.pop()
    return _parse(enumerate(lines, start=1), _Parser(source))


def read_last_table(
    lines: Iterable[tuple[int, str]],
    name: str,
    *,
    source: str | None = None,
    keep_rule: KeepRule | None = None,
) -> tuple[Table | None, tuple[str, ...]]:
    """The last `name` table of numbered save lines (without their newlines), and the
    warning lines: every line is checked as `parse_save` checks it, but only that table,
    and of it only the rules `keep_rule` wants, stay in memory (rule 5)."""
    found, warnings = read_last_tables(lines, {name: keep_rule}, source=source)
    return found.get(name), warnings


def read_last_tables(
    lines: Iterable[tuple[int, str]],
    wanted: Mapping[str, KeepRule | None],
    *,
    source: str | None = None,
) -> tuple[dict[str, Table], tuple[str, ...]]:
    """`read_last_table` for several tables in one pass: the last table of each name in
    `wanted`, each keeping the rules its predicate wants (None: all)."""
    ruleset = _parse(lines, _Parser(source, only=wanted))
    return {t.name: t for t in ruleset.tables}, ruleset.warnings


def _parse(lines: Iterable[tuple[int, str]], parser: _Parser) -> Ruleset:
    last = 0
    for number, raw in lines:
        parser.feed(number, raw.removesuffix("\r"))
        last = number
    return parser.finish(last)

"""Go's strconv as cnibox reproduces it (multicall.core.go.strconv): one Atoi, one Quote."""

from __future__ import annotations

import io

import pytest

from multicall.core.go.strconv import NumError, go_atoi, go_quote, go_quote_list
from multicall.effects.log import Logger


class TestGoAtoi:
    @pytest.mark.parametrize(("text", "value"), [("0", 0), ("+7", 7), ("-3", -3), ("007", 7)])
    def test_accepts(self, text: str, value: int) -> None:
        """Sign and leading zeros are fine, as in Go."""
        assert go_atoi(text) == value

    @pytest.mark.parametrize("text", ["", " 1", "1 ", "1_000", "٣", "+", "0x10", "1.0"])
    def test_rejects_syntax(self, text: str) -> None:
        """Spaces, underscores, non-ASCII digits and prefixes are invalid syntax."""
        with pytest.raises(NumError, match="invalid syntax"):
            go_atoi(text)

    def test_out_of_range(self) -> None:
        """Beyond int64 is Go's range error, with Go's wording."""
        with pytest.raises(NumError, match=r'parsing "9223372036854775808": value out of range'):
            go_atoi("9223372036854775808")

    def test_message(self) -> None:
        """The message is strconv's, which upstream passes on for uid annotations."""
        with pytest.raises(NumError, match=r'^strconv.Atoi: parsing "abc": invalid syntax$'):
            go_atoi("abc")

    def test_is_a_value_error(self) -> None:
        """NumError is a ValueError: callers that only care about failure catch that."""
        assert issubclass(NumError, ValueError)


class TestGoQuote:
    def test_quote(self) -> None:
        """strconv.Quote, as %q prints names in ARGS and version errors."""
        assert go_quote('a"b\\\n\x01é\u00a0') == '"a\\"b\\\\\\n\\x01é\\u00a0"'
        assert go_quote_list(["x=1", "y"]) == '["x=1" "y"]'

    @pytest.mark.parametrize(
        ("text", "quoted"),
        [("\x7f", '"\\x7f"'), ("\u200b", '"\\u200b"'), ("\U000e0001", '"\\U000e0001"')],
    )
    def test_non_printable(self, text: str, quoted: str) -> None:
        """DEL and other non-printable runes are escaped as Go escapes them (json.dumps
        would leave DEL and U+200B as they are)."""
        assert go_quote(text) == quoted

    def test_log_values_use_it(self) -> None:
        """logrus quotes a field value with %q: a DEL in a message reaches the log escaped."""
        out = io.BytesIO()
        Logger(out).info('invalid port configuration of "8\x7f"')
        assert 'msg="invalid port configuration of \\"8\\x7f\\""' in out.getvalue().decode()

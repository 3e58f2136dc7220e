"""Hypothesis strategies for JSON documents that Go's encoding/json round-trips as cnibox
does (the conflist patcher's laws and its Go oracle)."""

from __future__ import annotations

from hypothesis import strategies as st

from multicall.core.installer.conflist import Json

# Documents the Go 1.19 oracle prints like current Go: no \b or \f in strings (Go 1.22 changed
# their escapes) and integers within float64's exact range (cnibox keeps bigger ones exact).
json_text = st.text(st.characters(exclude_characters="\b\f", exclude_categories=["Cs"]), max_size=8)
_scalars = (
    st.none()
    | st.booleans()
    | st.integers(-(2**53), 2**53)
    | st.floats(allow_nan=False, allow_infinity=False)
    | json_text
)
json_values: st.SearchStrategy[Json] = st.recursive(
    _scalars,
    lambda inner: st.lists(inner, max_size=4) | st.dictionaries(json_text, inner, max_size=4),
    max_leaves=12,
)

"""Tests for app.ingest.mining.tokens: a body splits into Drain's own tokens."""

from __future__ import annotations

from drain3.drain import Drain
from hypothesis import example, given
from hypothesis import strategies as st

from app.ingest.mining.tokens import tokenize
from tests.support.mining import SETTINGS

_WS_TEXT = st.text(
    alphabet=st.sampled_from(list("ab=,:1<*> \t\n\r\x0b\x0c\xa0\u2003\u3000\x1c\x85")),
    max_size=40,
)


@SETTINGS
@given(body=_WS_TEXT, delimiters=st.sampled_from([(), ("=",), ("=", ","), (" :", ",")]))
@example(body="  :a b", delimiters=(" :", ","))  # drain3 strips before replacing
def test_tokenize_matches_drain3(body: str, delimiters: tuple[str, ...]) -> None:
    drain = Drain(extra_delimiters=delimiters)
    assert tokenize(body, delimiters) == drain.get_content_as_tokens(body)

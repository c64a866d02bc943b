"""How a log body becomes Drain's tokens, the one split every part of mining shares.

A body is split exactly as ``Drain.get_content_as_tokens`` does it. With no extra
delimiters that is ``body.split()``: runs of any whitespace Python's ``str.split`` knows
(space, tab, newline, the Unicode spaces) separate tokens, and leading or trailing
whitespace yields no token. With extra delimiters the body is stripped, each delimiter
is replaced by a space in the configured order, then split. Whitespace is not kept:
"a  b" and "a b" mine to the same template and parameters. Drain matches a body only to
a template with the same token count, so the parameters of a body are its tokens at the
template's ``PARAM`` positions, by index. A body token that is literally ``<*>`` is a
parameter like any other wildcard. Drain's masking lives in drain3's ``TemplateMiner``
and is not used.
"""

from __future__ import annotations

from collections.abc import Sequence

__all__ = ["PARAM", "mined_head", "mined_tokens", "tokenize"]

#: the wildcard a template holds where its bodies differ
PARAM = "<*>"


def tokenize(body: str, extra_delimiters: Sequence[str] = ()) -> list[str]:
    """Split a body into Drain's tokens, exactly as ``Drain.get_content_as_tokens``.

    Without delimiters ``str.split()`` already drops leading and trailing whitespace,
    so drain3's ``strip()`` changes nothing; with delimiters the strip comes first,
    because a delimiter may itself contain whitespace.
    """
    if not extra_delimiters:
        return body.split()
    content = body.strip()
    for delimiter in extra_delimiters:
        content = content.replace(delimiter, " ")
    return content.split()


def mined_head(
    body: str,
    extra_delimiters: Sequence[str] = (),
    max_chars: int | None = None,
    max_tokens: int | None = None,
) -> tuple[list[str], bool]:
    """The tokens the miner mines of ``body`` — only the head of a long body (its first
    ``max_chars`` characters, then its first ``max_tokens`` tokens) — and whether it was
    cut, so a re-match of the record later splits it exactly as the miner did."""
    cut = False
    if max_chars is not None and len(body) > max_chars:
        body = body[:max_chars]
        cut = True
    tokens = tokenize(body, extra_delimiters)
    if max_tokens is not None and len(tokens) > max_tokens:
        del tokens[max_tokens:]
        cut = True
    return tokens, cut


def mined_tokens(
    body: str,
    extra_delimiters: Sequence[str] = (),
    max_chars: int | None = None,
    max_tokens: int | None = None,
) -> list[str]:
    """``mined_head``'s tokens alone (the re-match's split)."""
    return mined_head(body, extra_delimiters, max_chars, max_tokens)[0]

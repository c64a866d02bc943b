"""The tenant name: its grammar and its bound, written once (DESIGN.md §3, RFC 0048 §3.1).

A tenant is 1 to ``MAX_TENANT_BYTES`` (128) bytes of ASCII graphic characters
(0x21-0x7E) except ``:``, ``#`` and ``/``: it is written into WAL frames, sidecars and
publish intents (the bound holds on encode and on decode), into object keys (``sink``)
and the receivers take it from a header. Every one of those checks it with what is
here; each words its refusal in its own error type.

It imports nothing: ``sink``, which imports nothing else of ours, takes the rule from
here.
"""

from __future__ import annotations

import re
from typing import Final

__all__ = [
    "MAX_TENANT_BYTES",
    "TENANT_CHARS",
    "TENANT_RULE",
    "bad_tenant_char",
    "is_valid_tenant",
]

#: RFC 0048 §3.1: the tenant grammar's bound, on encode and on decode.
MAX_TENANT_BYTES: Final = 128
#: The graphic ASCII characters a tenant may not hold, as a regex character class body:
#: 0x21-0x7E except ':' (0x3A), '#' (0x23) and '/' (0x2F).
TENANT_CHARS: Final = r"\x21\x22\x24-\x2e\x30-\x39\x3b-\x7e"
#: The rule in words, for a refusal to quote.
TENANT_RULE: Final = (
    f"a tenant is 1 to {MAX_TENANT_BYTES} bytes of ASCII graphic characters "
    "(0x21-0x7E) except ':', '#' and '/'"
)

_TENANT_RE: Final = re.compile(f"[{TENANT_CHARS}]{{1,{MAX_TENANT_BYTES}}}")
_BAD_CHAR_RE: Final = re.compile(f"[^{TENANT_CHARS}]")


def is_valid_tenant(tenant: str) -> bool:
    """Whether ``tenant`` is in the grammar (a ``str`` of one character per byte)."""
    return _TENANT_RE.fullmatch(tenant) is not None


def bad_tenant_char(tenant: str) -> int | None:
    """The offset of the first character the grammar does not allow, None if there is none
    (the name may still be empty or too long)."""
    bad = _BAD_CHAR_RE.search(tenant)
    return None if bad is None else bad.start()

"""Durations on the command line: ``"90"``, ``"90s"``, ``"10m"``, ``"1h"``, ``"500ms"``.

A module of its own so that ``python -m soak chaos`` (the chaos Job) parses its
arguments without importing the report's plotting or the verifier's Arrow code.
"""

from __future__ import annotations

import re
from typing import Final

__all__ = ["parse_duration"]

_DURATION: Final = re.compile(r"^\s*(\d+(?:\.\d+)?)\s*(ms|s|m|h)?\s*$")
_UNIT_S: Final = {"ms": 0.001, "s": 1.0, "m": 60.0, "h": 3600.0, None: 1.0}


def parse_duration(text: str) -> float:
    """``text`` in seconds; a bare number is seconds. Raises ``ValueError``."""
    match = _DURATION.match(text)
    if match is None:
        raise ValueError(f"duration {text!r}: expected a number with ms, s, m or h")
    return float(match.group(1)) * _UNIT_S[match.group(2)]

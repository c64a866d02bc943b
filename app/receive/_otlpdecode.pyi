"""The native OTLP logs decoder (app/receive/_otlpdecode.c); app/receive/native.py wraps it."""

from collections.abc import Sequence
from typing import Final

from typing_extensions import Buffer

OK: Final[int]
MALFORMED: Final[int]
SHAPE: Final[int]
UTF8: Final[int]
ID: Final[int]
SIZE: Final[int]
LIMIT: Final[int]
#: (message full name, field number, descriptor type) of every field the decoder reads
SCHEMA: Final[tuple[tuple[str, int, int], ...]]

class Block:
    """Memory the decoder filled (the buffer protocol, read-only)."""

    def __buffer__(self, flags: int, /) -> memoryview: ...

def decode(
    data: Buffer, limits: Sequence[int] | None = None, /
) -> tuple[int, int, tuple[int, ...], list[Block], int, int] | tuple[int, tuple[int, ...]]: ...

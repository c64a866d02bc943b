"""The miner's native fast path (app/ingest/mining/_minefast.c); native_miner.py wraps it."""

from collections.abc import Callable

def mine(
    root_children: dict[str, object],
    templates: dict[int, object],
    param: str,
    max_node_depth: int,
    sim_th: float,
    max_chars: int,
    max_tokens: int,
    bounded: bool,
    touch: Callable[[int], object] | None,
    bodies: list[str],
    ids: list[int],
    params: list[tuple[str, ...]],
    versions: list[int],
    start: int,
    tick: int,
    /,
) -> tuple[int, int, int, int, int | None, int]: ...
def oldest(ids: list[int], templates: dict[int, object], /) -> int: ...

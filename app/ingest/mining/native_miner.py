"""The miner's native fast path: ``TenantMiner._mine``'s loop for the bodies that match a
template exactly, in C (``app/ingest/mining/_minefast.c``, compiled by ``pip install``;
setup.py).

For each body from a given index on it splits, walks the tree, compares the leaf's
templates and, when the best match needs no widening, records it exactly as the Python
loop does (the same columns, ``cluster.size``, the LRU touch, ``touched``, the template
map's order), over the objects the miner keeps; at the first body that needs anything
else (a creation, a widening, a body over a ``max_body_*`` bound, an empty body, extra
delimiters) it returns that body's index and the Python loop, the reference, mines it.
tests/unit/app/ingest/mining/test_native_miner.py holds the two paths equal (a
differential test).

When the extension cannot be imported the miners run on the Python path alone, and
``ourios serve`` says so at start-up (the ``ingest.miner`` warning,
``ourios_build_info{miner="python"}``).
"""

from __future__ import annotations

from collections.abc import Callable, Mapping
from types import ModuleType
from typing import Final

__all__ = ["MINERS", "active", "fast_path", "start", "unavailable"]

#: what ``active`` answers: the fast path in C, or the Python loop alone
MINERS: Final = ("native", "python")


def _load() -> tuple[ModuleType | None, str]:
    try:
        from app.ingest.mining import _minefast as ext
    except ImportError as exc:
        return None, f"the native miner cannot be imported: {exc}"
    return ext, ""


_EXT, _UNAVAILABLE = _load()

#: ``mine(bodies, start, root_children, templates, param, max_node_depth, sim_th,
#: max_chars, max_tokens, bounded, touch, tick, ids, params, versions)`` →
#: ``(index, tick, work)`` (the C file's header)
FastPath = Callable[..., tuple[int, int, int]]


def fast_path() -> FastPath | None:
    """The extension's ``mine``, or None when it cannot be imported."""
    return None if _EXT is None else _EXT.mine  # type: ignore[no-any-return]


def active() -> str:
    """The miner in use: "native" or "python"."""
    return "python" if _EXT is None else "native"


def unavailable() -> str:
    """Why the native miner cannot be used ("" when it can)."""
    return _UNAVAILABLE


def start(emit: Callable[[str, Mapping[str, object], str], None]) -> str:
    """The ``ingest.miner`` event at ``ourios serve``'s start: which miner runs, a warning
    with the reason when it is the Python path alone."""
    miner = active()
    details: dict[str, object] = {"miner": miner}
    if _UNAVAILABLE:
        details["reason"] = _UNAVAILABLE
        details["message"] = "mining on the Python path alone: slower, same results"
    emit("ingest.miner", details, "warning" if _UNAVAILABLE else "info")
    return miner

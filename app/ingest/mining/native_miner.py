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

from collections import OrderedDict
from collections.abc import Callable, Mapping, Sequence
from functools import partial
from types import ModuleType
from typing import Final, cast

from app.ingest.mining.drain_tree import DrainTree, Template, Touchable
from app.ingest.mining.miner_config import MinerConfig
from app.ingest.mining.tokens import PARAM

__all__ = ["MINERS", "Stop", "active", "bind", "fast_path", "leaf_oldest", "start", "unavailable"]

#: what ``active`` answers: the fast path in C, or the Python loop alone
MINERS: Final = ("native", "python")


def _load() -> tuple[ModuleType | None, str]:
    try:
        from app.ingest.mining import _minefast as ext
    except ImportError as exc:
        return None, f"the native miner cannot be imported: {exc}"
    return ext, ""


_EXT, _UNAVAILABLE = _load()

#: ``mine(root_children, templates, param, max_node_depth, sim_th, max_chars, max_tokens,
#: bounded, touch, bodies, ids, params, versions, start, tick)`` →
#: ``(index, tick, work, found, best_id, compared)`` (the C file's header)
FastPath = Callable[..., "Stop"]
#: where the fast path stopped: ``(index, tick, work, found, best_id, compared)``; with
#: ``found`` 0 or 1 the body at ``index`` was searched and ``(best_id, compared)`` is the
#: search's answer (no template / a template to widen), with -1 Python searches
Stop = tuple[int, int, int, int, int | None, int]


def fast_path() -> FastPath | None:
    """The extension's ``mine``, or None when it cannot be imported."""
    return None if _EXT is None else _EXT.mine


def leaf_oldest(wanted: bool) -> Callable[[list[int], dict[int, Template]], int] | None:
    """The extension's ``oldest(ids, templates)`` (the id of the leaf's least recently
    used template, ``TenantMiner._create``'s victim), or None: not ``wanted``
    (``TenantMiner.native``) or no extension, and Python's ``min`` picks it."""
    if not wanted or _EXT is None:
        return None
    return cast(Callable[[list[int], dict[int, Template]], int], _EXT.oldest)


def bind(
    wanted: bool,
    drain: DrainTree,
    templates: dict[int, Template],
    config: MinerConfig,
    bodies: Sequence[str],
    ids: list[int],
    params: list[tuple[str, ...]],
    versions: list[int],
) -> Callable[[int, int], Stop] | None:
    """The fast path bound to one batch of a miner's tree (``TenantMiner._mine``):
    ``(index, tick)`` → ``Stop`` (the index it stopped at, the tick, the work, and the
    search of the body it stopped at when Python may take it); or None, and the Python
    loop mines the whole batch: not ``wanted`` (``TenantMiner.native``), no extension,
    extra delimiters (the split is then drain3's replace-and-split, left to Python), or
    bodies that are not a list."""
    mine = fast_path()
    if not wanted or mine is None or config.extra_delimiters or not isinstance(bodies, list):
        return None
    touch: Callable[[int], object] | None = None
    if config.max_clusters is not None:
        cache = drain.id_to_cluster
        # cachetools' [] is Cache.__getitem__ then its order's move_to_end; with the key
        # present (the template map mirrors Drain's) the C-level move is the same touch.
        order = getattr(cache, "_LRUCache__order", None)
        touch = (
            order.move_to_end
            if isinstance(order, OrderedDict)
            else cast(Touchable, cache).__getitem__
        )
    bounded = config.max_clusters is not None or config.max_leaf_clusters is not None
    return partial(
        mine, drain.root_node.key_to_child_node, templates, PARAM,
        drain.max_node_depth, drain.sim_th,
        -1 if config.max_body_chars is None else config.max_body_chars,
        -1 if config.max_body_tokens is None else config.max_body_tokens,
        bounded, touch, bodies, ids, params, versions,
    )  # fmt: skip


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

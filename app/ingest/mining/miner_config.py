"""``MinerConfig``: Drain's knobs for one tenant, checked when built.

Settings arrive from YAML, the environment and snapshots, so the config validates and
normalises itself (a list of delimiters becomes a tuple, an int threshold a float), and
an invalid value raises ``ValueError`` naming the setting.
"""

from __future__ import annotations

from dataclasses import dataclass, replace
from typing import NoReturn

__all__ = ["MinerConfig"]


@dataclass(frozen=True, slots=True)
class MinerConfig:
    """Drain's knobs for one tenant. Invalid values raise ``ValueError`` naming them."""

    sim_th: float = 0.4
    depth: int = 4
    max_children: int = 100
    #: None keeps every cluster; a number bounds them with Drain's LRU eviction
    max_clusters: int | None = None
    extra_delimiters: tuple[str, ...] = ()
    #: Drain's own default: tokens with a digit go down the tree's wildcard branch
    parametrize_numeric_tokens: bool = True
    #: None mines every character of a body; a number mines only its first that many
    #: (the body itself is stored whole): one body's share of the tree and the snapshot
    max_body_chars: int | None = None
    #: None mines every token; a number mines only the first that many of a body
    max_body_tokens: int | None = None
    #: None compares a body with every template of its leaf; a number keeps at most that
    #: many templates in one leaf (the leaf's least recently used is evicted), so one
    #: record's search compares at most that many
    max_leaf_clusters: int | None = None

    def __post_init__(self) -> None:
        self.validate()

    def validate(self) -> None:
        def refuse(name: str, value: object, allowed: str) -> NoReturn:
            raise ValueError(f"miner setting {name}={value!r} is outside {allowed}")

        if (
            not isinstance(self.sim_th, int | float)
            or isinstance(self.sim_th, bool)
            or not 0.0 <= self.sim_th <= 1.0
        ):
            refuse("sim_th", self.sim_th, "[0.0, 1.0]")
        # An int threshold would otherwise snapshot as "1" and restore as 1.0.
        object.__setattr__(self, "sim_th", float(self.sim_th))
        if not _is_int(self.depth) or not 3 <= self.depth <= 64:
            # drain3 refuses depth < 3; the upper bound only keeps trees sane
            refuse("depth", self.depth, "[3, 64]")
        if not _is_int(self.max_children) or not 1 <= self.max_children <= 1_000_000:
            # with 0 Drain would look up a wildcard child it never created
            refuse("max_children", self.max_children, "[1, 1000000]")
        if self.max_clusters is not None and (
            not _is_int(self.max_clusters) or not 1 <= self.max_clusters <= 100_000_000
        ):
            refuse("max_clusters", self.max_clusters, "None or [1, 100000000]")
        delimiters: object = self.extra_delimiters
        if isinstance(delimiters, list):
            # YAML gives lists; the frozen config keeps a hashable tuple.
            object.__setattr__(self, "extra_delimiters", tuple(delimiters))
        if not isinstance(self.extra_delimiters, tuple) or not all(
            isinstance(d, str) and d for d in self.extra_delimiters
        ):
            # an empty delimiter would make str.replace put a space between every char
            refuse("extra_delimiters", self.extra_delimiters, "a tuple of non-empty strings")
        for name in ("max_body_chars", "max_body_tokens", "max_leaf_clusters"):
            bound: object = getattr(self, name)
            if bound is not None and (
                not isinstance(bound, int)
                or isinstance(bound, bool)
                or not 1 <= bound <= 100_000_000
            ):
                refuse(name, bound, "None or [1, 100000000]")
        # Typed as bool, but configuration arrives from YAML and the environment.
        numeric: object = self.parametrize_numeric_tokens
        if not isinstance(numeric, bool):
            refuse("parametrize_numeric_tokens", numeric, "bool")

    def with_bounds(self, bounds: MinerConfig) -> MinerConfig:
        """This configuration with ``bounds``' four bounds (``max_clusters``,
        ``max_body_chars``, ``max_body_tokens``, ``max_leaf_clusters``): a restored tree
        keeps the knobs it was built under and takes the node's bounds."""
        return replace(
            self,
            max_clusters=bounds.max_clusters,
            max_body_chars=bounds.max_body_chars,
            max_body_tokens=bounds.max_body_tokens,
            max_leaf_clusters=bounds.max_leaf_clusters,
        )


def _is_int(value: object) -> bool:
    return isinstance(value, int) and not isinstance(value, bool)

"""``/metrics`` of a real node, scraped and parsed once for every test that reads it.

``scrape(node)`` asks a node (a ``ServeProcess``, or anything with its ``get``) for its
exposition and parses it with the Prometheus client's own parser; ``try_scrape`` is the
same for a node that may not answer yet (None then), ``scrape_until`` polls until a
condition holds (with a deadline). A ``Scrape`` answers by series name
and labels, so a test never splits exposition lines itself:

* ``value(name, **labels)`` — the one sample of ``name`` whose labels include
  ``labels`` (None when there is none);
* ``total(name, **labels)`` — the sum over every such sample (0 when there is none);
* ``series('name{label="value"}')`` — ``value`` of a series spelled as in the
  exposition (and as in docs/METRICS.md and the alerts); ``scrape[spelling]`` is the
  same for a series that must be there (``KeyError`` otherwise), and ``spelling in
  scrape`` says whether it is.
"""

from __future__ import annotations

import re
from collections.abc import Callable
from dataclasses import dataclass
from typing import Protocol

from prometheus_client.parser import text_string_to_metric_families
from prometheus_client.samples import Sample

from tests.support.poll import poll_until

__all__ = ["Scrape", "scrape", "scrape_until", "try_scrape"]

_SERIES = re.compile(r"(\w+)(?:\{(.*)\})?")
_LABEL = re.compile(r'(\w+)="([^"]*)"')


class Scrapeable(Protocol):
    def get(self, path: str) -> tuple[int, bytes]: ...


@dataclass(frozen=True)
class Scrape:
    """One exposition, parsed: families keyed by their series name."""

    text: str
    families: dict[str, tuple[str, list[Sample]]]

    @classmethod
    def parse(cls, text: str) -> Scrape:
        families: dict[str, tuple[str, list[Sample]]] = {}
        for family in text_string_to_metric_families(text):
            # The parser names a counter family without its _total; the interface
            # (and every query) uses the series name.
            name = f"{family.name}_total" if family.type == "counter" else family.name
            families[name] = (family.type, list(family.samples))
        return cls(text, families)

    def samples(self, name: str, **labels: str) -> list[Sample]:
        """The samples named ``name`` (a histogram's ``_bucket``/``_count`` included)
        whose labels include ``labels``."""
        return [
            s
            for _, samples in self.families.values()
            for s in samples
            if s.name == name and all(s.labels.get(k) == v for k, v in labels.items())
        ]

    def value(self, name: str, **labels: str) -> float | None:
        """The sample of ``name`` whose labels include ``labels`` (None when absent)."""
        found = [s.value for s in self.samples(name, **labels)]
        assert len(found) <= 1, (name, labels, found)
        return found[0] if found else None

    def series(self, spelling: str) -> float | None:
        """``value`` of the series ``spelling`` names, ``name`` or ``name{k="v",...}``."""
        m = _SERIES.fullmatch(spelling)
        assert m is not None, f"not a series: {spelling!r}"
        return self.value(m.group(1), **dict(_LABEL.findall(m.group(2) or "")))

    def __getitem__(self, spelling: str) -> float:
        value = self.series(spelling)
        if value is None:
            raise KeyError(spelling)
        return value

    def __contains__(self, spelling: object) -> bool:
        return isinstance(spelling, str) and self.series(spelling) is not None

    def total(self, name: str, **labels: str) -> float:
        """The sum over every series of ``name`` with ``labels`` (0 when it has none)."""
        return sum(s.value for s in self.samples(name, **labels))


def try_scrape(node: Scrapeable) -> Scrape | None:
    """The node's ``/metrics``, parsed; None when it does not answer 200."""
    status, body = node.get("/metrics")
    return Scrape.parse(body.decode()) if status == 200 else None


def scrape(node: Scrapeable) -> Scrape:
    """The node's ``/metrics``, parsed; fails the test when it does not answer 200."""
    status, body = node.get("/metrics")
    assert status == 200, f"/metrics answered {status}"
    return Scrape.parse(body.decode())


def scrape_until(node: Scrapeable, done: Callable[[Scrape], bool], timeout: float = 20.0) -> Scrape:
    """Poll the node's /metrics until ``done`` holds (an external process: polling
    with a deadline is the only way to observe it)."""
    last: list[Scrape] = []

    def holds() -> bool:
        last[:] = [scrape(node)]
        return done(last[0])

    poll_until(
        "condition", holds, deadline_s=timeout, detail=lambda: f"last scrape:\n{last[0].text}"
    )
    return last[0]

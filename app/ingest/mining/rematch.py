"""Re-matching records to a later version of their template: a batch's records to the
version the batch ends with (``rematch_batch``, when it is mined), and a partition's
records to the versions of one instant (``VersionMap``, when it is encoded).

Drain creates a template from its first body (version 1 is that body's own text, so the
body has no parameters) and widens it as later bodies differ (each widening turns
constants into ``<*>`` and is a new version). A record mined before a widening in the
same batch would otherwise carry parameters of a version its batch no longer ends with.

Invariants:

* Widening only turns constants into ``PARAM``, so a body that matched an earlier
  version matches every later one token for token: its parameters under the later
  version are its tokens at that version's ``PARAM`` positions.
* The result depends only on the batch and the miner state before it, so a replay of
  the frame re-mines and re-matches to the same rows; every version a row names is
  announced by a ``TemplateEvent`` of the same batch or of an earlier one, so its text
  is in the audit stream before the record (DESIGN.md §3 "Template versions of a
  record").
"""

from __future__ import annotations

from collections.abc import Callable, Mapping, Sequence
from dataclasses import dataclass, field

import numpy as np
import pyarrow as pa

from app.ingest.mining.tokens import PARAM

__all__ = ["VersionMap", "params_under", "rematch_batch"]


def params_under(tokens: Sequence[str], template: Sequence[str]) -> tuple[str, ...]:
    """A body's parameters under ``template``: its tokens at the ``PARAM`` positions.

    ``ValueError`` when the body does not fit the template (a different token count, or
    a constant that differs): a record is only ever re-matched to a widening of the
    template it matched.
    """
    if len(tokens) != len(template):
        raise ValueError(f"{len(tokens)} tokens do not fit a template of {len(template)}")
    out: list[str] = []
    for token, slot in zip(tokens, template, strict=True):
        if slot == PARAM:
            out.append(token)
        elif slot != token:
            raise ValueError(f"token {token!r} does not fit the constant {slot!r}")
    return tuple(out)


def rematch_batch(
    bodies: Sequence[str],
    template_ids: Sequence[int],
    params: list[tuple[str, ...]],
    versions: list[int],
    changes: Sequence[tuple[int, int, str, int]],
    split: Callable[[str], list[str]],
) -> None:
    """Bring every record of a batch to its template's last version in the batch, in
    place. ``changes`` are the batch's template events as ``(template_id, version,
    template text, index)`` in order; a record at index ``i`` whose template changed at
    an index after ``i`` gets that last version and its parameters under its text."""
    last: dict[int, tuple[int, list[str], int]] = {}
    for template_id, version, text, index in changes:
        # The text is the template's tokens joined by one space; no token holds
        # whitespace, so splitting gives the tokens back.
        last[template_id] = (version, text.split(" ") if text else [], index)
    if not last:
        return
    for i, template_id in enumerate(template_ids):
        final = last.get(template_id)
        if final is None or final[2] <= i:
            continue
        version, template, _ = final
        params[i] = params_under(split(bodies[i]), template)
        versions[i] = version


@dataclass(frozen=True, slots=True)
class VersionMap:
    """One tenant's widened templates at one instant, applied to its rows when they are
    encoded (DESIGN.md §3 "Template versions of a record").

    ``versions`` maps a template id to its version and tokens then (``TenantMiner.versions``:
    never changed afterwards); ``split`` is the miner's own split of a body (only the head
    of a long one: ``TenantMiner.mined_tokens``), so a record is re-matched on exactly
    the tokens it was mined from. Taken where the buffers and the miner agree — a cut's
    capture (the state at its mark), a size trigger or age sweep between two turns, the
    recovery's publish — with the partition's audit watermark raised to the tenant's
    events then, so every version it names is published before the rows.

    Calling it on a ``RECORDS_SCHEMA`` batch returns the batch with every row whose
    version is older than its template's here re-matched to that version (parameters and
    ``template_version``), or the same batch when none is. The cost: one binary search
    of the batch's template ids in the map's sorted ids (``stale_rows``); only a batch
    with a stale row has its parameter and version columns rebuilt, and only its stale
    rows are split again. A pure function of the rows and the map, so every attempt at a
    partition publishes the same rows."""

    versions: Mapping[int, tuple[int, tuple[str, ...]]]
    split: Callable[[str], list[str]]
    #: ``versions`` as two sorted arrays (ids, version numbers), built at the first call:
    #: a batch's stale rows are found by one binary search over its template ids instead
    #: of an Arrow comparison per widened template (a cut's flush lane spent ~19 µs a
    #: record on those with 32 tenants' partitions of small per-turn batches).
    _index: list[tuple[np.ndarray, np.ndarray]] = field(
        default_factory=list, init=False, repr=False, compare=False
    )

    def _lookup(self) -> tuple[np.ndarray, np.ndarray]:
        if not self._index:
            ids = np.fromiter(self.versions, dtype=np.int64, count=len(self.versions))
            numbers = np.fromiter(
                (v[0] for v in self.versions.values()), dtype=np.int64, count=len(ids)
            )
            order = np.argsort(ids, kind="stable")
            self._index.append((ids[order], numbers[order]))
        return self._index[0]

    def stale_rows(self, batch: pa.RecordBatch) -> np.ndarray:
        """The positions of ``batch``'s rows whose version is older than their
        template's here, ascending."""
        if not self.versions or batch.num_rows == 0:
            return np.empty(0, dtype=np.int64)
        keys, numbers = self._lookup()
        ids = batch.column("template_id").to_numpy()
        at = np.searchsorted(keys, ids)
        np.minimum(at, len(keys) - 1, out=at)
        current = np.where(keys[at] == ids, numbers[at], 0)
        return np.flatnonzero(batch.column("template_version").to_numpy() < current)

    def __call__(self, batch: pa.RecordBatch) -> pa.RecordBatch:
        rows = self.stale_rows(batch)
        if len(rows) == 0:
            return batch
        versions = self.versions
        ids = batch.column("template_id")
        mined = batch.column("template_version")
        params = batch.column("template_params").to_pylist()
        numbers = mined.to_pylist()
        bodies = batch.column("body")
        id_list = ids.to_pylist()
        split = self.split
        for row in rows.tolist():
            version, template = versions[id_list[row]]
            try:
                params[row] = list(params_under(split(bodies[row].as_py()), template))
            except ValueError:
                continue  # never a widening of what it matched: keeps its own version
            numbers[row] = version
        schema = batch.schema
        columns = list(batch.columns)
        at = schema.get_field_index
        columns[at("template_params")] = pa.array(params, schema.field("template_params").type)
        columns[at("template_version")] = pa.array(numbers, schema.field("template_version").type)
        return pa.RecordBatch.from_arrays(columns, schema=schema)

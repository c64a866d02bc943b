"""Re-matching a batch's records to the version of their template the batch ends with.

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

from collections.abc import Callable, Sequence

from app.ingest.mining.tokens import PARAM

__all__ = ["params_under", "rematch_batch"]


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

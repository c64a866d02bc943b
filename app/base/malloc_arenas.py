"""The C allocator's arenas: part of the resident-memory bound (DESIGN.md §5.12).

glibc gives a thread that meets a locked arena a new one, up to eight per core, and
keeps what each arena once held. The core runs a dozen threads that allocate (the turn,
the committer, the spiller, the publishers, the receivers' links), so a store outage,
which puts the spiller and the publishers to work beside the turn, grew the core's
resident memory by 26–42 MB with glibc's default (two runs) and by 0–26 MB with two
arenas (six runs of tests/crash/test_bounded_memory_serve.py). Few arenas suit a Python
process: its threads allocate while they hold the GIL, so they seldom contend for one.

``bound_malloc_arenas`` runs first in ``ourios serve``: it limits this process with
``mallopt`` (arenas made from then on) and puts ``MALLOC_ARENA_MAX`` in the environment
that the worker processes inherit, where glibc reads it at their start. An operator's
own ``MALLOC_ARENA_MAX`` wins (it is the allocator's documented knob); 0 leaves glibc's
default.

``disable_huge_pages`` runs beside it: Arrow's allocator (mimalloc) hands freed pages
back to the kernel within milliseconds and faults them in again on the next batch, and
with transparent huge pages each such fault zeroes a whole 2 MiB page for a 60 KiB
batch — 28–37 % of the core's CPU under the ingest benchmark (``perf``: kernel
``clear_page_erms`` under ``do_huge_pmd_anonymous_page``, from ``mi_page_free_list_extend``;
1.3 % with huge pages off, docs/BENCHMARKS.md). The setting is the process's, and
``fork`` and ``exec`` keep it, so the worker processes run without them too.
"""

from __future__ import annotations

import ctypes
import ctypes.util
import os
from collections.abc import MutableMapping

#: arenas per process unless the environment says otherwise
DEFAULT_ARENAS = 2
#: glibc's malloc.h: ``mallopt(M_ARENA_MAX, n)``
_M_ARENA_MAX = -8
#: linux/prctl.h: ``prctl(PR_SET_THP_DISABLE, 1, 0, 0, 0)``
_PR_SET_THP_DISABLE = 41
ENV = "MALLOC_ARENA_MAX"


def bound_malloc_arenas(environ: MutableMapping[str, str] = os.environ) -> int | None:
    """Limit the arenas of this process and of the processes it starts.

    Returns the limit in force, or None when it is left to glibc (``MALLOC_ARENA_MAX=0``,
    a value that is not a number, or a C library without ``mallopt``).
    """
    wanted = environ.setdefault(ENV, str(DEFAULT_ARENAS))
    try:
        arenas = int(wanted)
    except ValueError:
        return None
    if arenas <= 0:
        return None
    try:
        libc = ctypes.CDLL(ctypes.util.find_library("c"))
        mallopt = libc.mallopt
    except (OSError, AttributeError):  # not glibc (musl has no mallopt arenas)
        return None
    mallopt.argtypes = (ctypes.c_int, ctypes.c_int)
    mallopt.restype = ctypes.c_int
    return arenas if mallopt(_M_ARENA_MAX, arenas) == 1 else None


def _libc_malloc_trim() -> ctypes._NamedFuncPointer | None:
    try:
        trim = ctypes.CDLL(ctypes.util.find_library("c")).malloc_trim
    except (OSError, AttributeError):  # not glibc
        return None
    trim.argtypes = (ctypes.c_size_t,)
    trim.restype = ctypes.c_int
    return trim


_MALLOC_TRIM = _libc_malloc_trim()


def release_freed_memory() -> None:
    """Give the C allocator's free memory back to the kernel (``malloc_trim``; nothing
    without glibc). For a worker that has just dropped the parse of a request refused
    over a limit — up to 30 times its body, in small blocks: kept in an arena's free
    lists, one such parse per arena would stay resident beside the next decode's, and
    two arenas made a worker's peak one parse higher than the decode slots allow."""
    if _MALLOC_TRIM is not None:
        _MALLOC_TRIM(0)


def disable_huge_pages() -> bool:
    """No transparent huge pages for this process and the processes it starts; False
    where the kernel or the C library has no such switch (the node runs as before)."""
    try:
        prctl = ctypes.CDLL(ctypes.util.find_library("c"), use_errno=True).prctl
    except (OSError, AttributeError):
        return False
    # the kernel reads four unsigned longs after the option and refuses unused ones
    # that are not zero, so they are passed at their full width
    prctl.argtypes = (ctypes.c_int, *(ctypes.c_ulong,) * 4)
    prctl.restype = ctypes.c_int
    return bool(prctl(_PR_SET_THP_DISABLE, 1, 0, 0, 0) == 0)

"""Tests for app.ingest.mining.template_ids: the id layout and the durable allocator."""

from __future__ import annotations

import os
import signal
import struct
import subprocess
import sys
import threading
from pathlib import Path
from typing import Any

import crc32c
import pytest
from hypothesis import given
from hypothesis import strategies as st

from app.ingest.mining.errors import (
    MinerError,
    TemplateIdError,
    TemplateIdExhaustedError,
    TemplateIdStateError,
)
from app.ingest.mining.template_ids import (
    MAX_COUNTER,
    FileTemplateIdAllocator,
    decode_allocator_state,
    encode_allocator_state,
    make_template_id,
)
from tests.support.mining import SETTINGS, flip


def test_template_id_layout() -> None:
    assert make_template_id(0, 1) == 1
    assert make_template_id(7, 5) == (7 << 48) | 5
    assert make_template_id(32767, MAX_COUNTER) == (1 << 63) - 1
    assert make_template_id(32768, 1) == -(1 << 63) + 1  # the sign bit is the ordinal's
    assert make_template_id(65535, MAX_COUNTER) == -1
    assert make_template_id(40000, 2) > make_template_id(40000, 1)
    for bad in [(-1, 1), (65536, 1), (0, 0), (0, MAX_COUNTER + 1)]:
        with pytest.raises(ValueError):
            make_template_id(*bad)


def test_file_allocator_hands_out_ordinal_prefixed_ids(tmp_path: Path) -> None:
    allocator = FileTemplateIdAllocator(tmp_path / "ids", node_ordinal=9, block=3)
    ids = [allocator.allocate() for _ in range(7)]
    assert ids == [(9 << 48) | c for c in range(1, 8)]
    assert allocator.high_water == 9
    assert decode_allocator_state((tmp_path / "ids").read_bytes()) == (9, 9)
    assert not (tmp_path / "ids.tmp").exists()


@SETTINGS
@given(
    block=st.integers(1, 6),
    lives=st.lists(st.integers(0, 15), min_size=1, max_size=6),
)
def test_file_allocator_resumes_above_every_id_after_crashes(
    tmp_path_factory: pytest.TempPathFactory, block: int, lives: list[int]
) -> None:
    path = tmp_path_factory.mktemp("alloc") / "ids"
    returned: list[int] = []
    for count in lives:
        # Each life hands out `count` ids and is then abandoned without any shutdown,
        # usually in the middle of a block.
        allocator = FileTemplateIdAllocator(path, node_ordinal=1, block=block)
        for _ in range(count):
            new = allocator.allocate()
            assert not returned or new > max(returned)
            returned.append(new)
    assert len(set(returned)) == len(returned)


def test_file_allocator_survives_sigkill_mid_block(tmp_path: Path) -> None:
    path = tmp_path / "ids"
    script = (
        "import os, signal, sys\n"
        "from pathlib import Path\n"
        "from app.ingest.mining.template_ids import FileTemplateIdAllocator\n"
        f"a = FileTemplateIdAllocator(Path({str(path)!r}), node_ordinal=2, block=10)\n"
        "for _ in range(25):\n"
        "    print(a.allocate(), flush=True)\n"
        "os.kill(os.getpid(), signal.SIGKILL)\n"
    )
    done = subprocess.run(
        [sys.executable, "-c", script], capture_output=True, text=True, timeout=60, check=False
    )
    assert done.returncode == -signal.SIGKILL, done.stderr
    before = [int(line) for line in done.stdout.split()]
    assert len(before) == 25
    after = FileTemplateIdAllocator(path, node_ordinal=2, block=10).allocate()
    assert after > max(before)


def _faulty_fs(tmp_path: Path) -> Any:
    fs_module = pytest.importorskip("wal.testing")
    if not hasattr(fs_module, "FaultyFs"):
        pytest.skip("wal.testing has no FaultyFs")
    return fs_module.FaultyFs(tmp_path / "shadow")


@pytest.mark.parametrize("op", ["open", "write", "fsync", "close", "rename", "fsync_dir"])
@pytest.mark.parametrize("nth", [1, 2, 3])
def test_file_allocator_power_loss_at_every_reservation_step(
    tmp_path: Path, op: str, nth: int
) -> None:
    fs = _faulty_fs(tmp_path)
    fs_module: Any = sys.modules["wal.testing"]
    data = tmp_path / "data"
    data.mkdir()
    path = data / "ids"
    fs.crash_at(op, nth=nth)
    returned: list[int] = []
    with pytest.raises(fs_module.SimulatedCrash):
        allocator = FileTemplateIdAllocator(path, node_ordinal=4, block=2, fs=fs)
        for _ in range(100):
            returned.append(allocator.allocate())
    fs.apply_crash(power_loss=True)
    resumed = FileTemplateIdAllocator(path, node_ordinal=4, block=2)
    fresh = [resumed.allocate() for _ in range(5)]
    assert not returned or min(fresh) > max(returned)


def test_file_allocator_io_failure_hands_out_nothing(tmp_path: Path) -> None:
    fs = _faulty_fs(tmp_path)
    data = tmp_path / "data"
    data.mkdir()
    allocator = FileTemplateIdAllocator(data / "ids", node_ordinal=0, block=2, fs=fs)
    first = [allocator.allocate(), allocator.allocate()]
    fs.fail("fsync_dir")
    with pytest.raises(TemplateIdError, match="parent directory fsync failed"):
        allocator.allocate()
    assert allocator.high_water == 2
    third = allocator.allocate()  # the fault was one-shot; the block is reserved again
    assert third == 3 and first == [1, 2]
    assert FileTemplateIdAllocator(data / "ids", node_ordinal=0).allocate() > third


def test_file_allocator_refuses_another_nodes_file(tmp_path: Path) -> None:
    FileTemplateIdAllocator(tmp_path / "ids", node_ordinal=1).allocate()
    with pytest.raises(TemplateIdStateError, match="recorded node ordinal 1"):
        FileTemplateIdAllocator(tmp_path / "ids", node_ordinal=2)


_GOOD_STATE = encode_allocator_state(5, 4096)


@pytest.mark.parametrize(
    ("content", "reason"),
    [
        pytest.param(b"", "length 0", id="empty"),
        pytest.param(_GOOD_STATE[:-1], "length 23", id="truncated"),
        pytest.param(_GOOD_STATE + b"\0", "length 25", id="trailing"),
        pytest.param(b"XTID" + _GOOD_STATE[4:], "bad magic", id="bad_magic"),
        pytest.param(flip(_GOOD_STATE, 14), "CRC mismatch", id="bad_crc"),
        pytest.param(
            (lambda h: h + struct.pack("<I", crc32c.crc32c(h)))(
                struct.pack("<4sHHHHQ", b"OTID", 2, 0, 5, 0, 1)
            ),
            "unknown version 2",
            id="bad_version",
        ),
        pytest.param(
            (lambda h: h + struct.pack("<I", crc32c.crc32c(h)))(
                struct.pack("<4sHHHHQ", b"OTID", 1, 0, 5, 1, 1)
            ),
            "reserved",
            id="nonzero_reserved",
        ),
        pytest.param(
            (lambda h: h + struct.pack("<I", crc32c.crc32c(h)))(
                struct.pack("<4sHHHHQ", b"OTID", 1, 0, 5, 0, MAX_COUNTER + 1)
            ),
            "48-bit",
            id="high_water_out_of_range",
        ),
    ],
)
def test_file_allocator_refuses_corrupt_state(tmp_path: Path, content: bytes, reason: str) -> None:
    (tmp_path / "ids").write_bytes(content)
    with pytest.raises(TemplateIdStateError, match=reason) as info:
        FileTemplateIdAllocator(tmp_path / "ids", node_ordinal=5)
    assert str(tmp_path / "ids") in str(info.value)


def test_file_allocator_golden_state() -> None:
    assert _GOOD_STATE.hex() == (
        "4f544944"
        "0100"
        "0000"
        "0500"
        "0000"
        "0010000000000000" + struct.pack("<I", crc32c.crc32c(_GOOD_STATE[:20])).hex()
    )


def test_file_allocator_exhaustion(tmp_path: Path) -> None:
    (tmp_path / "ids").write_bytes(encode_allocator_state(0, MAX_COUNTER - 2))
    allocator = FileTemplateIdAllocator(tmp_path / "ids", node_ordinal=0, block=100)
    assert [allocator.allocate(), allocator.allocate()] == [MAX_COUNTER - 1, MAX_COUNTER]
    with pytest.raises(TemplateIdExhaustedError):
        allocator.allocate()
    assert isinstance(TemplateIdExhaustedError(Path("x"), "y"), MinerError)


def test_file_allocator_is_thread_safe(tmp_path: Path) -> None:
    allocator = FileTemplateIdAllocator(tmp_path / "ids", node_ordinal=0, block=7)
    results: list[list[int]] = [[] for _ in range(4)]

    def work(out: list[int]) -> None:
        for _ in range(500):
            out.append(allocator.allocate())

    threads = [threading.Thread(target=work, args=(out,)) for out in results]
    for thread in threads:
        thread.start()
    for thread in threads:
        thread.join()
    every = [i for out in results for i in out]
    assert len(set(every)) == 2000
    assert all(out == sorted(out) for out in results)


def test_file_allocator_rejects_bad_arguments(tmp_path: Path) -> None:
    for ordinal, block in [(-1, 1), (65536, 1), (0, 0), (0, MAX_COUNTER + 1)]:
        with pytest.raises(ValueError):
            FileTemplateIdAllocator(tmp_path / "ids", ordinal, block)
    assert not os.path.exists(tmp_path / "ids")

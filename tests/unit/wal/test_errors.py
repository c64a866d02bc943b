"""``wal.errors``: each error names what refused and the numbers an operator needs, and
its class (how a receiver reports it) is a property of the type."""

from __future__ import annotations

import errno
from pathlib import Path

import pytest

from wal.errors import (
    AppendError,
    CheckpointError,
    CorruptionError,
    ErrorClass,
    FrameRejected,
    FrameTooLarge,
    InvalidConfig,
    InvalidTenant,
    JournalClosed,
    OpenError,
    OpenIoError,
    RotationRetrying,
    RotationTerminal,
    WalError,
    WalIoError,
    WalNoSpace,
    is_no_space,
)


def test_corruption_names_the_file_and_the_offset() -> None:
    exc = CorruptionError("/wal/00000003.wal", 4096, "bad crc", high_water=8192)
    assert str(exc) == "WAL corruption in /wal/00000003.wal at byte 4096: bad crc"
    assert exc.path == Path("/wal/00000003.wal")
    assert (exc.offset, exc.reason, exc.high_water) == (4096, "bad crc", 8192)


def test_corruption_without_an_offset_names_the_file_only() -> None:
    exc = CorruptionError(Path("/wal/CHECKPOINT"), None, "short file")
    assert str(exc) == "WAL corruption in /wal/CHECKPOINT: short file"
    assert exc.high_water is None


def test_invalid_config_names_the_knob_value_and_range() -> None:
    exc = InvalidConfig("segment_bytes", 0, "at least 1 MiB")
    assert str(exc) == "invalid WAL setting segment_bytes=0: must be at least 1 MiB"
    assert exc.error_class is ErrorClass.INVALID


def test_open_io_error_names_the_step_and_file() -> None:
    cause = OSError(errno.EIO, "Input/output error")
    exc = OpenIoError("/wal/00000001.wal", "fsync", cause)
    assert "fsync /wal/00000001.wal" in str(exc) and "Input/output error" in str(exc)
    assert exc.cause is cause


def test_frame_too_large_names_both_sizes() -> None:
    exc = FrameTooLarge(70_000, 65_536)
    assert str(exc) == "frame of 70000 bytes exceeds max_frame_bytes=65536"
    assert (exc.size, exc.limit) == (70_000, 65_536)


def test_io_error_says_the_batch_was_not_acknowledged() -> None:
    exc = WalIoError("write", "/wal/00000002.wal", OSError(errno.EIO, "EIO"))
    assert str(exc).startswith("WAL write failed on /wal/00000002.wal")
    assert str(exc).endswith("the batch was not acknowledged")


def test_no_space_message_says_whether_the_disk_was_touched() -> None:
    cause = OSError(errno.ENOSPC, "No space left on device")
    hit = WalNoSpace("fsync", "/wal/00000002.wal", cause)
    latched = WalNoSpace("write", "/wal/00000002.wal", cause, latched=True)
    assert "fsync failed on /wal/00000002.wal" in str(hit) and "full" in str(hit)
    assert not hit.latched
    assert str(latched).startswith("WAL refused the batch without writing it")
    assert latched.latched and latched.op == "write" and latched.cause is cause
    assert isinstance(latched, WalIoError)


def test_rotation_errors_carry_attempts_and_first_error() -> None:
    retrying = RotationRetrying(2, 5, "ENOSPC on rename")
    terminal = RotationTerminal(5, "ENOSPC on rename")
    assert "2 of 5 attempts" in str(retrying) and "ENOSPC on rename" in str(retrying)
    assert "after 5 consecutive failed attempts" in str(terminal)
    assert "ENOSPC on rename" in str(terminal)


@pytest.mark.parametrize(
    ("exc", "error_class", "error_type"),
    [
        (CorruptionError("f", 0, "r"), ErrorClass.TRANSIENT, "wal_corrupt"),
        (InvalidConfig("k", 1, "x"), ErrorClass.INVALID, "wal_config"),
        (FrameTooLarge(2, 1), ErrorClass.INVALID, "wal_frame_too_large"),
        (InvalidTenant("bad tenant"), ErrorClass.INVALID, "wal_invalid_tenant"),
        (WalIoError("write", "f", OSError()), ErrorClass.TRANSIENT, "wal_io"),
        (WalNoSpace("write", "f", OSError()), ErrorClass.TRANSIENT, "wal_no_space"),
        (RotationRetrying(1, 2, "e"), ErrorClass.TRANSIENT, "wal_rotation_retrying"),
        (RotationTerminal(2, "e"), ErrorClass.TERMINAL, "wal_rotation_terminal"),
        (JournalClosed(), ErrorClass.TRANSIENT, "wal_closed"),
        (CheckpointError("x"), ErrorClass.TRANSIENT, "wal_checkpoint"),
    ],
)
def test_class_and_label_are_properties_of_the_type(
    exc: WalError, error_class: ErrorClass, error_type: str
) -> None:
    assert exc.error_class is error_class
    assert exc.error_type == error_type
    assert type(exc).error_class is error_class  # survives being re-raised elsewhere


def test_the_tree_is_as_documented() -> None:
    assert issubclass(CorruptionError, OpenError) and issubclass(OpenIoError, OpenError)
    assert issubclass(InvalidConfig, OpenError)
    for cls in (FrameRejected, WalIoError, RotationRetrying, RotationTerminal, JournalClosed):
        assert issubclass(cls, AppendError)
    assert issubclass(FrameTooLarge, FrameRejected) and issubclass(InvalidTenant, FrameRejected)
    assert issubclass(WalNoSpace, WalIoError)
    assert not issubclass(CheckpointError, (OpenError, AppendError))


def test_is_no_space() -> None:
    assert is_no_space(OSError(errno.ENOSPC, "full"))
    assert is_no_space(OSError(errno.EDQUOT, "quota"))
    assert not is_no_space(OSError(errno.EIO, "io"))
    assert not is_no_space(ValueError("not an OSError"))

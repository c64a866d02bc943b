"""Object stores: the shared contract (MemoryStore, LocalStore), LocalStore's atomic
writes and directory fsyncs, and ``from_url``."""

from __future__ import annotations

import errno
import os
import threading
from collections.abc import Callable, Iterator
from pathlib import Path

import pytest

from sink.store import (
    InvalidKey,
    LocalStore,
    ObjectNotFound,
    ObjectStore,
    S3Store,
    StoreError,
    from_url,
)
from sink.testing import MemoryStore

KEY = "records/tenant=acme%3Dprod/date=2024-05-01/ourios-0-x.parquet"


@pytest.fixture(params=["memory", "local"])
def store(request: pytest.FixtureRequest, tmp_path: Path) -> ObjectStore:
    if request.param == "memory":
        return MemoryStore()
    return LocalStore(tmp_path / "objects")


# --- the contract every store keeps ----------------------------------------------------


def test_is_an_object_store(store: ObjectStore) -> None:
    assert isinstance(store, ObjectStore)


def test_put_get_overwrite_delete(store: ObjectStore) -> None:
    store.put(KEY, b"one")
    assert store.get(KEY) == b"one"
    store.put(KEY, b"two")
    assert store.get(KEY) == b"two"
    store.delete(KEY)
    with pytest.raises(ObjectNotFound) as info:
        store.get(KEY)
    assert info.value.error_type.endswith("_not_found") and not info.value.ambiguous


def test_delete_of_a_missing_key_is_a_no_op(store: ObjectStore) -> None:
    store.delete("never/written")


def test_put_if_absent_never_replaces(store: ObjectStore) -> None:
    assert store.put_if_absent(KEY, b"first") is True
    assert store.put_if_absent(KEY, b"first") is False  # same content: still False
    assert store.put_if_absent(KEY, b"other") is False
    assert store.get(KEY) == b"first"


def test_list_is_a_sorted_string_prefix_match(store: ObjectStore) -> None:
    keys = ["b/2", "a/1", "a/10/x", "ab", "a/2"]
    for key in keys:
        store.put(key, key.encode())
    assert store.list("") == sorted(keys)
    assert store.list("a/") == ["a/1", "a/10/x", "a/2"]
    assert store.list("a/1") == ["a/1", "a/10/x"]
    assert store.list("a") == ["a/1", "a/10/x", "a/2", "ab"]
    assert store.list("c") == []
    assert store.list("zz/yy/") == []


def test_empty_objects(store: ObjectStore) -> None:
    store.put("e", b"")
    assert store.get("e") == b""
    assert store.put_if_absent("f", b"") is True and store.get("f") == b""


@pytest.mark.parametrize(
    "key",
    ["../escape", "a/../../escape", "/etc/passwd", "a//b", "", ".hidden", "a/.tmp", "a\\b"],
)
@pytest.mark.parametrize("op", ["put", "put_if_absent", "get", "delete"])
def test_invalid_keys_are_refused(store: ObjectStore, op: str, key: str, tmp_path: Path) -> None:
    calls: dict[str, Callable[[], object]] = {
        "put": lambda: store.put(key, b"x"),
        "put_if_absent": lambda: store.put_if_absent(key, b"x"),
        "get": lambda: store.get(key),
        "delete": lambda: store.delete(key),
    }
    with pytest.raises(InvalidKey) as info:
        calls[op]()
    assert info.value.error_type == "invalid_key" and isinstance(info.value, ValueError)
    assert store.list("") == []
    assert not (tmp_path / "escape").exists()


def test_list_refuses_escaping_prefixes(store: ObjectStore) -> None:
    with pytest.raises(InvalidKey):
        store.list("../")
    with pytest.raises(InvalidKey):
        store.list("/abs")


def test_concurrent_put_if_absent_has_exactly_one_winner(store: ObjectStore) -> None:
    n = 8
    start = threading.Barrier(n)
    results: dict[int, bool] = {}

    def create(i: int) -> None:
        start.wait()
        results[i] = store.put_if_absent(KEY, f"writer-{i}".encode())

    threads = [threading.Thread(target=create, args=(i,)) for i in range(n)]
    for t in threads:
        t.start()
    for t in threads:
        t.join()
    winners = [i for i, won in results.items() if won]
    assert len(results) == n and len(winners) == 1
    assert store.get(KEY) == f"writer-{winners[0]}".encode()


# --- LocalStore: files, atomicity, fsyncs ----------------------------------------------


def test_local_store_maps_keys_under_root(tmp_path: Path) -> None:
    store = LocalStore(tmp_path / "objects")
    store.put(KEY, b"data")
    assert (tmp_path / "objects" / KEY).read_bytes() == b"data"
    assert store.describe() == (tmp_path / "objects").as_uri()
    assert store.describe().startswith("file:///")


def test_local_store_needs_an_absolute_root() -> None:
    with pytest.raises(ValueError, match="absolute"):
        LocalStore(Path("relative/objects"))


def _temp_files(root: Path) -> list[Path]:
    return list(root.rglob(".*.tmp"))


class FsyncSpy:
    """Wraps os.fsync: records, for each fsync, the file and what the key held then."""

    def __init__(self, final: Path) -> None:
        self.final = final
        self.seen: list[tuple[str, bytes | None]] = []
        self._real = os.fsync

    def __call__(self, fd: int) -> None:
        target = os.readlink(f"/proc/self/fd/{fd}")
        current = self.final.read_bytes() if self.final.exists() else None
        self.seen.append((target, current))
        self._real(fd)


@pytest.fixture
def fsync_spy(tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> Iterator[FsyncSpy]:
    spy = FsyncSpy(tmp_path / "objects" / "a" / "k")
    monkeypatch.setattr(os, "fsync", spy)
    yield spy


@pytest.mark.parametrize("op", ["put", "put_if_absent"])
def test_bytes_are_fsynced_under_a_temp_name_before_the_key_shows_them(
    op: str, tmp_path: Path, fsync_spy: FsyncSpy
) -> None:
    store = LocalStore(tmp_path / "objects")
    if op == "put":
        store.put("a/k", b"old")
        fsync_spy.seen.clear()
        store.put("a/k", b"new")
        before = b"old"
    else:
        assert store.put_if_absent("a/k", b"new")
        before = None
    file_syncs = [(t, cur) for t, cur in fsync_spy.seen if not os.path.isdir(t)]
    assert len(file_syncs) == 1
    target, current = file_syncs[0]
    assert Path(target).name.startswith(".k.") and target.endswith(".tmp")
    assert current == before  # the key did not yet hold a byte of the new object
    assert (tmp_path / "objects" / "a" / "k").read_bytes() == b"new"
    # the directory is fsynced after the rename/link, when the key holds the new bytes
    assert fsync_spy.seen[-1] == (str(tmp_path / "objects" / "a"), b"new")
    assert _temp_files(tmp_path) == []


def test_new_directories_have_their_parents_fsynced(tmp_path: Path, fsync_spy: FsyncSpy) -> None:
    root = tmp_path / "objects"
    LocalStore(root).put("a/b/c/k", b"x")
    dirs = [t for t, _ in fsync_spy.seen if os.path.isdir(t)]
    # each created directory's parent, in creation order, then the key's directory
    assert dirs == [str(p) for p in (tmp_path, root, root / "a", root / "a" / "b")] + [
        str(root / "a" / "b" / "c")
    ]


def test_a_reader_never_sees_a_partial_object(tmp_path: Path) -> None:
    store = LocalStore(tmp_path / "objects")

    def payload(i: int) -> bytes:
        return bytes([i % 256]) * (10 + 4099 * i)

    def whole(data: bytes) -> bool:
        i, rest = divmod(len(data) - 10, 4099)
        return rest == 0 and data == payload(i)

    store.put("k", payload(0))
    stop = threading.Event()
    torn: list[int] = []
    reads = 0

    def reader() -> None:
        nonlocal reads
        while not stop.is_set():
            data = store.get("k")
            reads += 1
            if not whole(data):
                torn.append(len(data))

    thread = threading.Thread(target=reader)
    thread.start()
    try:
        for i in range(1, 120):
            store.put("k", payload(i))
    finally:
        stop.set()
        thread.join()
    assert torn == [] and reads > 0


def test_a_failed_write_leaves_neither_the_key_nor_a_temp_file(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    store = LocalStore(tmp_path / "objects")
    store.put("a/k", b"old")

    def no_space(fd: int) -> None:
        raise OSError(errno.ENOSPC, "No space left on device")

    monkeypatch.setattr(os, "fsync", no_space)
    with pytest.raises(StoreError) as info:
        store.put("a/k", b"new")
    assert info.value.error_type == "local_no_space" and not info.value.ambiguous
    with pytest.raises(StoreError) as info:
        store.put_if_absent("a/other", b"new")
    assert info.value.error_type == "local_no_space" and not info.value.ambiguous
    monkeypatch.undo()
    assert store.get("a/k") == b"old"
    assert store.list("") == ["a/k"]
    assert _temp_files(tmp_path) == []


def test_a_failed_directory_fsync_after_the_rename_is_ambiguous(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    store = LocalStore(tmp_path / "objects")
    store.put("a/seed", b"")  # the directory exists, so only the final dir fsync runs
    real = os.fsync

    def dir_fails(fd: int) -> None:
        if os.path.isdir(os.readlink(f"/proc/self/fd/{fd}")):
            raise OSError(errno.EIO, "Input/output error")
        real(fd)

    monkeypatch.setattr(os, "fsync", dir_fails)
    for op in (lambda: store.put("a/k", b"new"), lambda: store.put_if_absent("a/j", b"new")):
        with pytest.raises(StoreError) as info:
            op()
        assert info.value.error_type == "local_io" and info.value.ambiguous
    monkeypatch.undo()
    # the object is visible (it may not survive a power cut): a retry must expect it
    assert store.get("a/k") == b"new" and store.get("a/j") == b"new"


def test_list_ignores_temp_files_and_empty_directories(tmp_path: Path) -> None:
    root = tmp_path / "objects"
    store = LocalStore(root)
    store.put("a/k", b"x")
    (root / "a" / ".k.0123.tmp").write_bytes(b"partial")
    (root / "empty" / "dir").mkdir(parents=True)
    (root / ".hidden").mkdir()
    (root / ".hidden" / "k").write_bytes(b"x")
    assert store.list("") == ["a/k"]


def test_local_get_of_a_directory_is_not_found(tmp_path: Path) -> None:
    store = LocalStore(tmp_path / "objects")
    store.put("a/k", b"x")
    with pytest.raises(ObjectNotFound):
        store.get("a")


def test_local_errors_name_the_operation_and_key(tmp_path: Path) -> None:
    root = tmp_path / "objects"
    store = LocalStore(root)
    store.put("a", b"file, not a directory")
    with pytest.raises(StoreError) as info:
        store.put("a/k", b"x")
    err = info.value
    assert (err.op, err.key, err.error_type, err.attempts) == ("put", "a/k", "local_denied", 1)
    assert "a/k" in str(err)


# --- MemoryStore ----------------------------------------------------------------------


def test_memory_store_snapshot_and_describe() -> None:
    store = MemoryStore()
    store.put("a", b"1")
    assert store.snapshot() == {"a": b"1"}
    assert store.describe().startswith("memory://")


# --- from_url -------------------------------------------------------------------------


def test_from_url_file(tmp_path: Path) -> None:
    store = from_url((tmp_path / "o b").as_uri())
    assert isinstance(store, LocalStore) and store.root == tmp_path / "o b"
    store.put("k", b"v")
    assert (tmp_path / "o b" / "k").read_bytes() == b"v"
    assert isinstance(from_url(f"file://localhost{tmp_path}"), LocalStore)


def test_from_url_s3(monkeypatch: pytest.MonkeyPatch) -> None:
    monkeypatch.setenv("AWS_ACCESS_KEY_ID", "k")
    monkeypatch.setenv("AWS_SECRET_ACCESS_KEY", "s")
    monkeypatch.setenv("AWS_DEFAULT_REGION", "eu-west-1")
    store = from_url("s3://logs/ourios/prod/", endpoint_url="http://127.0.0.1:1")
    assert isinstance(store, S3Store)
    assert (store.bucket, store.prefix) == ("logs", "ourios/prod")
    assert store.describe() == "s3://logs/ourios/prod at http://127.0.0.1:1"
    plain = from_url("s3://logs")
    assert isinstance(plain, S3Store) and plain.prefix == ""
    assert plain.describe().startswith("s3://logs at https://")


def test_from_url_s3_passes_the_region_to_the_client(monkeypatch: pytest.MonkeyPatch) -> None:
    monkeypatch.setenv("AWS_ACCESS_KEY_ID", "k")
    monkeypatch.setenv("AWS_SECRET_ACCESS_KEY", "s")
    monkeypatch.setenv("AWS_DEFAULT_REGION", "eu-west-1")
    store = from_url("s3://logs", endpoint_url="http://127.0.0.1:1", region="ap-south-2")
    assert isinstance(store, S3Store)
    assert store.region == "ap-south-2"  # the setting, not the chain
    assert from_url("s3://logs").region == "eu-west-1"  # type: ignore[attr-defined]
    with pytest.raises(ValueError, match="region 'ap-south-2' applies only to s3://"):
        from_url("file:///tmp/x", region="ap-south-2")


@pytest.mark.parametrize(
    "url",
    [
        "http://example.com/x",
        "gs://bucket/x",
        "/abs/path",
        "file://relative/path",
        "file:relative",
        "s3:///no-bucket",
        "s3://bucket/a/../b",
        "s3://bucket/p?versionId=1",
        "",
    ],
)
def test_from_url_refuses_other_urls_naming_the_accepted_ones(url: str) -> None:
    with pytest.raises(ValueError) as info:
        from_url(url)
    assert repr(url) in str(info.value)


def test_from_url_unsupported_scheme_lists_the_schemes() -> None:
    with pytest.raises(ValueError, match=r"file:///.*s3://"):
        from_url("gs://bucket/x")


def test_from_url_refuses_an_endpoint_for_a_file_store(tmp_path: Path) -> None:
    with pytest.raises(ValueError, match="s3://"):
        from_url(tmp_path.as_uri(), endpoint_url="http://127.0.0.1:9000")

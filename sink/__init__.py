"""The sink: Arrow buffers, Parquet encoding, object keys, the object stores and the
publisher (DESIGN.md §2, §3, §5.12, §5.13, §10).

Of ours, ``sink`` imports only the tenant rule (``wal.tenant``) and ``wal.ObjectKind``
(records or audit); ``app`` builds the buffers and the publisher on top of what is
exported here (the names other packages use). The modules:

* ``sink.buffers`` — per-partition columnar rows waiting to be published, the detached
  partitions and the in-flight registry.
* ``sink.claims`` — what an object holds, stated before its PUT (the publish intent).
* ``sink.deadletter`` — partitions the store refuses for good, kept on the data volume.
* ``sink.keys`` — the key layout: where each published object lives in the store.
* ``sink.parquet`` — the schemas, their columnar buffers and the Parquet encoders.
* ``sink.publisher`` — the thread that encodes detached partitions and writes them.
* ``sink.spool`` — the spool and the spiller of the memory bound (DESIGN.md §5.12).
* ``sink.store`` — the ``ObjectStore`` contract, ``LocalStore``, ``S3Store``, ``from_url``.
* ``sink.testing`` — the test doubles (``MemoryStore``, ``FailingStore``); tests import
  them from there, and nothing in production does.
"""

from sink.buffers import NANOS_PER_DAY, Buffers, Detached, PublishOutcome
from sink.claims import Claim, IntentHook
from sink.deadletter import DeadLetter
from sink.keys import archive_key, decode_tenant, encode_tenant, node_identity
from sink.parquet import (
    FLAT_SCHEMA,
    RECORDS_SCHEMA,
    RecordColumns,
    assemble_records,
    encode_records,
    encode_table,
)
from sink.publisher import Publisher, StoreGate
from sink.spool import Spiller, Spool
from sink.store import LocalStore, ObjectNotFound, ObjectStore, S3Store, StoreError, from_url

__all__ = [
    "FLAT_SCHEMA",
    "NANOS_PER_DAY",
    "RECORDS_SCHEMA",
    "Buffers",
    "Claim",
    "DeadLetter",
    "Detached",
    "IntentHook",
    "LocalStore",
    "ObjectNotFound",
    "ObjectStore",
    "Publisher",
    "PublishOutcome",
    "RecordColumns",
    "S3Store",
    "Spiller",
    "Spool",
    "StoreError",
    "StoreGate",
    "archive_key",
    "assemble_records",
    "decode_tenant",
    "encode_records",
    "encode_table",
    "encode_tenant",
    "from_url",
    "node_identity",
]

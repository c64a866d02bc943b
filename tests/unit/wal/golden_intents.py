"""Golden PUBLISHING file (issue 16, ``wal/intents.py``). Regenerate only on purpose:

    .venv/bin/python -m tests.unit.wal.golden_intents

The header, a records intent (three frames), an audit intent (two events, one template
id with the node-ordinal bits set) and a records intent under a tenant whose key
segment is percent-encoded.
"""

from __future__ import annotations

from tests.unit.wal.golden import write_golden
from wal.intents import IntentRecord, ObjectKind, encode_header, encode_record


def golden_records() -> list[IntentRecord]:
    return [
        IntentRecord(
            ObjectKind.RECORDS,
            "acme",
            "records/tenant=acme/date=2025-11-24/ourios-0-0190a3c2-7f1e-7b2a-9c4d-5e6f708192a3.parquet",
            20_416,
            frames=(4_096, 8_192, 1 << 40),
        ),
        IntentRecord(
            ObjectKind.AUDIT,
            "acme",
            "audit/tenant=acme/date=2025-11-24/ourios-0-0190a3c2-7f1e-7b2a-9c4d-5e6f708192a4.parquet",
            20_416,
            events=((8_192, (1 << 48) | 7, 1), (8_192, 3, 2)),
        ),
        IntentRecord(
            ObjectKind.RECORDS,
            "a:b",
            "records/tenant=a%3Ab/date=1970-01-01/ourios-0-0190a3c2-7f1e-7b2a-9c4d-5e6f708192a5.parquet",
            0,
            frames=(12_288,),
        ),
    ]


def golden_intents_file() -> bytes:
    return encode_header() + b"".join(encode_record(r) for r in golden_records())


FILES = {"publishing_v1.bin": golden_intents_file}


if __name__ == "__main__":
    write_golden(FILES)

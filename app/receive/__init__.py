"""The receivers and the worker side (DESIGN.md §2, §5). The modules:

* ``otlp_http``, ``otlp_grpc`` — the OTLP/HTTP and OTLP/gRPC receivers.
* ``otlp`` — request bodies in, record columns (``app.base.batch.FlatBatch``) and wire
  replies out, and the request limits; ``native`` — the native decoder (its C extension
  ``_otlpdecode``).
* ``auth`` — bearer tokens and tenants; ``tls`` — TLS and its certificate reload.
* ``inflight`` — what one receiving process holds at once.
* ``api`` — the receivers' port to the pipeline (``IngestPort``).
* ``worker_process`` — a worker process; ``channel`` — its framed channel to the core.
* ``testing`` — the test double of the port (``StubPort``); production never imports it.
"""

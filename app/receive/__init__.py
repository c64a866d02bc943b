"""The receivers and the worker side: OTLP/HTTP and OTLP/gRPC, auth, decoding and
flattening to Arrow, the receivers' port to the pipeline, the worker process and its
channel to the core (DESIGN.md §2, §5).
"""

"""The native extensions' build (pyproject.toml holds everything else): `pip install .`
and `pip install -e .` compile app/receive/_otlpdecode.c into app.receive._otlpdecode
(the decoder) and app/ingest/mining/_minefast.c into app.ingest.mining._minefast (the
miner's fast path; without it the miners run on the Python path, the ingest.miner
warning).

With a C compiler present a failed compile fails the install. Without one the package
installs without the extension, and the node runs on the upb path and says so at
start-up (the receive.decoder warning, docs/RUNBOOK.md); the Dockerfile's build refuses
a wheel without it."""

import os
import shlex
import shutil

from setuptools import Extension, setup

_compiler = shlex.split(os.environ.get("CC", "gcc") or "gcc")[0]

setup(
    ext_modules=[
        Extension(
            "app.receive._otlpdecode",
            sources=["app/receive/_otlpdecode.c"],
            extra_compile_args=["-O2", "-std=c11", "-Wall", "-Wextra"],
            optional=shutil.which(_compiler) is None,
        ),
        Extension(
            "app.ingest.mining._minefast",
            sources=["app/ingest/mining/_minefast.c"],
            extra_compile_args=["-O2", "-std=c11", "-Wall", "-Wextra"],
            optional=shutil.which(_compiler) is None,
        ),
    ]
)

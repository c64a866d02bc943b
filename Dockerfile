# syntax=docker/dockerfile:1
#
# The ourios image: `ourios serve` as a non-root user on a read-only root filesystem.
#
#   docker build -t ourios:0.1.0 .
#   docker run --read-only --tmpfs /tmp -v ourios-data:/var/lib/ourios \
#       -p 4317:4317 -p 4318:4318 ourios:0.1.0
#
# The builder stage turns this source tree into a wheel (the same package `pip install .`
# installs, with the native OTLP decoder compiled: setup.py, app/receive/_otlpdecode.c)
# and collects wheels of its dependencies; the runtime stage installs exactly those wheels
# into /opt/venv with --no-index, so the package can only be the one built from this
# tree, never a release of the same name from an index. The compiler stays in the builder.
# At run time the process writes only to the data volume (OURIOS_SERVER_DATA_DIR) and /tmp.

ARG PYTHON_IMAGE=python:3.11-slim-bookworm

FROM ${PYTHON_IMAGE} AS builder
ENV PIP_DISABLE_PIP_VERSION_CHECK=1 \
    PIP_NO_CACHE_DIR=1 \
    PYTHONDONTWRITEBYTECODE=1
WORKDIR /src
# gcc and the C library headers for the native decoder (the image has Python's headers).
RUN apt-get update \
    && apt-get install -y --no-install-recommends gcc libc6-dev \
    && rm -rf /var/lib/apt/lists/*
# Only what the wheel is built from (.dockerignore keeps everything else out).
COPY pyproject.toml setup.py README.md ./
COPY app/ app/
COPY wal/ wal/
COPY sink/ sink/
RUN python -m pip wheel --wheel-dir /wheels . \
    && ls /wheels/ourios-*.whl \
    && python -m zipfile -l /wheels/ourios-*.whl | grep -q 'app/receive/_otlpdecode\..*\.so'

FROM ${PYTHON_IMAGE} AS runtime
ARG VERSION=0.1.0
LABEL org.opencontainers.image.title="ourios" \
      org.opencontainers.image.description="OTLP log ingester for Kubernetes: WAL before ack, Parquet to S3" \
      org.opencontainers.image.version="${VERSION}" \
      org.opencontainers.image.licenses="Apache-2.0"

# A fixed uid/gid, so the chart's runAsUser/fsGroup and a volume's ownership agree.
RUN groupadd --system --gid 10001 ourios \
    && useradd --system --uid 10001 --gid 10001 --home-dir /var/lib/ourios \
       --no-create-home --shell /usr/sbin/nologin ourios \
    && mkdir -p /var/lib/ourios \
    && chown 10001:10001 /var/lib/ourios \
    && chmod 0750 /var/lib/ourios

# The venv gets no pip of its own; the base image's pip installs into it (and compiles
# the bytecode now: the root filesystem is read-only at run time). The wheels are bind-
# mounted from the builder, so they never become a layer of this image.
RUN --mount=type=bind,from=builder,source=/wheels,target=/wheels \
    python -m venv --without-pip /opt/venv \
    && python -m pip --python /opt/venv/bin/python install \
       --no-index --find-links=/wheels --no-cache-dir /wheels/ourios-*.whl \
    && /opt/venv/bin/ourios --version \
    && /opt/venv/bin/python -c "import app.receive._otlpdecode"

ENV PATH=/opt/venv/bin:$PATH \
    HOME=/tmp \
    TMPDIR=/tmp \
    PYTHONDONTWRITEBYTECODE=1 \
    PYTHONUNBUFFERED=1 \
    OURIOS_SERVER_DATA_DIR=/var/lib/ourios

USER 10001:10001
WORKDIR /var/lib/ourios
VOLUME ["/var/lib/ourios"]
# 4317 OTLP/gRPC; 4318 OTLP/HTTP, /metrics, /healthz, /readyz.
EXPOSE 4317 4318
# The app handles SIGTERM itself: drain the listeners, then the final cut (DESIGN.md §6).
STOPSIGNAL SIGTERM
ENTRYPOINT ["ourios"]
CMD ["serve"]

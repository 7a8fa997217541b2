# The omnilearn worker image: one container = one training rank (or the ASP parameter server).
#
#   docker build -t omnilearn-worker:latest .
#   docker run --rm --init --read-only -v "$PWD/runs/x/job.json:/run/omnilearn/job.json:ro" ... \
#       omnilearn-worker:latest omnilearn worker --job /run/omnilearn/job.json   (the launcher's mounts: README)
#
# BASE_IMAGE is any Debian/Ubuntu image with python3 (3.10+) and its venv module: the official slim
# image by default; where no registry is reachable, `omnilearn image build` makes one with debootstrap
# (omnilearn-base:bookworm) and passes it here. Dependencies come from requirements.lock (exact pins,
# --no-deps, then `pip check`), so the image runs exactly what `make install` runs on the host. uv installs
# them (pinned below): it fetches and unpacks the wheels in parallel and compiles their bytecode on every
# CPU, about 1.6 times quicker than pip (results/2026-12-07_2cpu_worker-image-uv.md).
#
# Layers, slowest first, so that editing the project's code rebuilds only the last, small layer:
#   1. CA certificates + venv   2. torch/torchvision and their CUDA wheels (their pins alone)
#   3. the other pins           4. the project (pytorch/, configs/), installed editable from /opt/omnilearn
ARG BASE_IMAGE=python:3.11-slim

# ---------------------------------------------------------------------------------------- the pins
# Split requirements.lock in two files. The heavy file only changes when torch's own pins change, and the
# final stage copies it by content, so bumping e.g. rich does not reinstall 3 GB of torch.
FROM ${BASE_IMAGE} AS pins
# Pins never installed in the image (test and lint tools): space-separated names.
ARG DEV_PINS="pytest ruff iniconfig pluggy"
# Where torch/torchvision come from. Empty: PyPI, with the CUDA wheels the lock pins (large, but it is
# what the lock describes). A CPU-only index (https://download.pytorch.org/whl/cpu) gives the same
# versions as +cpu builds and drops the nvidia-*/cuda-*/triton pins: about 5 GB smaller.
ARG TORCH_INDEX_URL=""
COPY requirements.lock /tmp/requirements.lock
RUN set -eu; \
    dev="$(echo "${DEV_PINS}" | tr -s ' ' '|')"; \
    grep -v -E '^[[:space:]]*(#|$)' /tmp/requirements.lock | grep -v -i -E "^(${dev:-@none@})==" > /tmp/all.txt; \
    heavy='^(torch|torchvision|triton|nvidia-[a-z0-9-]+|cuda-[a-z0-9-]+)=='; \
    if [ -n "${TORCH_INDEX_URL}" ]; then \
        grep -i -E '^(torch|torchvision)==' /tmp/all.txt > /tmp/heavy.txt; \
    else \
        grep -i -E "${heavy}" /tmp/all.txt > /tmp/heavy.txt; \
    fi; \
    grep -v -i -E "${heavy}" /tmp/all.txt > /tmp/rest.txt; \
    grep -q -i '^torch==' /tmp/heavy.txt || { echo "requirements.lock pins no torch==" >&2; exit 1; }; \
    mkdir /pins && mv /tmp/heavy.txt /tmp/rest.txt /pins/

# ---------------------------------------------------------------------------------------- the image
FROM ${BASE_IMAGE}
ARG TORCH_INDEX_URL=""
# setuptools builds the project (--no-build-isolation: no download at each code change).
ARG SETUPTOOLS_VERSION=84.2.1
# uv installs the pins (the --no-deps installs below).
ARG UV_VERSION=0.13.9

LABEL org.opencontainers.image.title="omnilearn-worker" \
      org.opencontainers.image.description="omnilearn training worker (container-based heterogeneity emulation)" \
      org.opencontainers.image.licenses="MIT"

# OMP_WAIT_POLICY=PASSIVE: idle OpenMP threads sleep instead of spinning, otherwise a worker throttled by
# its CPU quota burns the quota spinning and the emulated heterogeneity is not what the config says.
# The CA variables point every client (pip, uv, requests, OpenSSL) at the system store, which holds the
# extra certificates of docker/ca/ when there are some. UV_COMPILE_BYTECODE: the workers never write
# bytecode (PYTHONDONTWRITEBYTECODE), so it is compiled once here, as pip does by default.
ENV VIRTUAL_ENV=/opt/venv \
    PATH=/opt/venv/bin:$PATH \
    PYTHONUNBUFFERED=1 \
    PYTHONDONTWRITEBYTECODE=1 \
    OMP_WAIT_POLICY=PASSIVE \
    PIP_NO_CACHE_DIR=1 \
    PIP_DISABLE_PIP_VERSION_CHECK=1 \
    PIP_DEFAULT_TIMEOUT=180 \
    PIP_CERT=/etc/ssl/certs/ca-certificates.crt \
    REQUESTS_CA_BUNDLE=/etc/ssl/certs/ca-certificates.crt \
    SSL_CERT_FILE=/etc/ssl/certs/ca-certificates.crt \
    UV_NO_CACHE=1 \
    UV_HTTP_TIMEOUT=180 \
    UV_COMPILE_BYTECODE=1

# Extra CAs (for a TLS-inspecting proxy): every docker/ca/*.crt joins the trust store.
COPY docker/ca/ /tmp/omnilearn-ca/
RUN set -eu; \
    dest=/usr/local/share/ca-certificates/omnilearn; \
    mkdir -p "$dest"; \
    find /tmp/omnilearn-ca -maxdepth 1 -type f -name '*.crt' -exec cp {} "$dest/" \; ; \
    if [ -n "$(ls -A "$dest")" ]; then \
        if command -v update-ca-certificates >/dev/null 2>&1; then \
            update-ca-certificates >/dev/null 2>&1 || update-ca-certificates; \
        else \
            mkdir -p /etc/ssl/certs && cat "$dest"/*.crt >> /etc/ssl/certs/ca-certificates.crt; \
        fi; \
        echo "added $(ls "$dest" | wc -l) extra CA file(s) to the trust store"; \
    fi; \
    rm -rf /tmp/omnilearn-ca; \
    test -s /etc/ssl/certs/ca-certificates.crt \
        || { echo "the base image has no /etc/ssl/certs/ca-certificates.crt: install ca-certificates in it" >&2; exit 1; }; \
    python3 -c 'import sys; assert sys.version_info >= (3, 10), sys.version' \
        || { echo "the base image's python3 is older than 3.10" >&2; exit 1; }; \
    python3 -m venv /opt/venv; \
    /opt/venv/bin/python -m pip install --quiet "setuptools==${SETUPTOOLS_VERSION}" "uv==${UV_VERSION}"

# torch and its CUDA wheels: the longest step, cached as long as their pins do not change.
COPY --from=pins /pins/heavy.txt /tmp/pins/heavy.txt
RUN set -eu; \
    if [ -n "${TORCH_INDEX_URL}" ]; then \
        uv pip install --no-deps --index-url "${TORCH_INDEX_URL}" -r /tmp/pins/heavy.txt; \
    else \
        uv pip install --no-deps -r /tmp/pins/heavy.txt; \
    fi

# Every other pin, exactly; `pip check` proves the set is complete for this Python.
COPY --from=pins /pins/rest.txt /tmp/pins/rest.txt
RUN uv pip install --no-deps -r /tmp/pins/rest.txt && pip check

# The user workers run as: no login, no home of its own (HOME is the container's /tmp tmpfs), owning
# nothing in the image. The launcher passes it (--user 10001:10001), or the launching user's own ids
# when that user is not root (README, "Security model").
RUN groupadd --system --gid 10001 omnilearn \
    && useradd --system --uid 10001 --gid 10001 --home-dir /tmp --no-create-home --shell /usr/sbin/nologin omnilearn

# The project itself, editable: the code lives once, in /opt/omnilearn/pytorch (a launcher may bind-mount a
# working tree over it), and configs/ sits beside it so relative config paths work from WORKDIR.
WORKDIR /opt/omnilearn
COPY pyproject.toml README.m[d] ./
COPY configs/ configs/
COPY pytorch/ pytorch/
RUN pip install --quiet --no-deps --no-build-isolation -e . \
    && rm -rf build pytorch/*.egg-info \
    && omnilearn --help >/dev/null

# No ENTRYPOINT: the command is the worker, e.g. `omnilearn worker --job /run/job.json`, so the container
# lives exactly as long as the worker. Run it with an init (docker run --init, or init=True in the SDK and
# in a swarm ContainerSpec) so SIGTERM reaches Python: as PID 1 it would ignore it.
USER 10001:10001
CMD ["omnilearn", "--help"]

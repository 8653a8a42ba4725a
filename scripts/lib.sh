# Shared by the set-up scripts.
UV_VERSION=0.13.9
export UV_LINK_MODE=copy
export CMAKE_BUILD_PARALLEL_LEVEL="${CMAKE_BUILD_PARALLEL_LEVEL:-$(nproc)}"
# The first install compiles llama.cpp for llama-cpp-python. hark loads only libllama and
# libggml, so leave out what llama-cpp-python builds besides: the multimodal library (mtmd,
# LLAVA_BUILD) and llama.cpp's common library (llama-cpp-lean.cmake says how). That is three
# fifths of the compile. CMAKE_ARGS of your own (e.g. -DGGML_CUDA=on) are kept. A wheel that
# uv has already built is reused as it is, whatever these say.
export CMAKE_ARGS="${CMAKE_ARGS:+$CMAKE_ARGS }-DLLAVA_BUILD=OFF -DCMAKE_PROJECT_llama.cpp_INCLUDE=$(printf %q "$(cd "$(dirname "${BASH_SOURCE[0]}")" && pwd)/llama-cpp-lean.cmake")"

ensure_uv() {
  if ! command -v uv >/dev/null 2>&1 || [ "$(uv --version | cut -d' ' -f2)" != "$UV_VERSION" ]; then
    python3 -m pip install --quiet --disable-pip-version-check "uv==$UV_VERSION"
  fi
}

# uv keeps the wheels it built from an sdist (llama-cpp-python's) under that download of the
# sdist, and fetches the sdist again once its cached copy is no longer fresh: llama.cpp is
# then compiled again though nothing changed (seen here: a fresh clone, an hour and a half
# after the last build, compiled it anew). So install from uv's cache alone when it holds
# everything the lock names, and ask the index only when it does not.
uv_sync() {
  uv sync --offline --quiet "$@" 2>/dev/null || uv sync "$@"
}

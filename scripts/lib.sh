# Shared by the set-up scripts.
UV_VERSION=0.13.9
export UV_LINK_MODE=copy
export CMAKE_BUILD_PARALLEL_LEVEL="${CMAKE_BUILD_PARALLEL_LEVEL:-$(nproc)}"

ensure_uv() {
  if ! command -v uv >/dev/null 2>&1 || [ "$(uv --version | cut -d' ' -f2)" != "$UV_VERSION" ]; then
    python3 -m pip install --quiet --disable-pip-version-check "uv==$UV_VERSION"
  fi
}

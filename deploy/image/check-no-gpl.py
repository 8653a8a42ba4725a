"""Fail when the image holds a GPL component: run by the Dockerfile's AV=lgpl stages.

    python check-no-gpl.py [--ffmpeg-only] [ROOT ...]      (default root: /app/.venv)

Checks, in this order, and prints every finding before it exits 1:

- every ELF shared object under the roots (FFmpeg's libraries are in the venv's lib/ffmpeg)
  and every library `ldd` resolves for it: none may be a library known to be under the GPL (x264,
  x265, FFmpeg's libpostproc, Xvid, Rubber Band, vid.stab, frei0r, LAME's, whose fft.c
  Debian lists as GPL) nor the non-free fdk-aac;
- PyAV's FFmpeg: each of its libraries says what licence it was built under
  (``avcodec_license()`` and the like) and how it was configured; a licence that is not
  the LGPL, or --enable-gpl, --enable-nonfree, libx264 or libx265 in the configuration,
  fails;
- no ``av.libs`` (the PyPI wheel's bundled libraries);
- unless --ffmpeg-only: no installed Python distribution that declares the GPL (the LGPL's
  are libraries, not counted), and no espeak-ng data (Piper's phonemes).

The base system's own programs (Debian's bash, coreutils and the like) are not counted: they
are in every image built on it, and nothing of hark's links them.
"""

from __future__ import annotations

import ctypes
import importlib.metadata
import pathlib
import re
import subprocess
import sys

GPL_LIBRARIES = re.compile(
    r"lib(x264|x265|postproc|xvidcore|rubberband|vidstab|frei0r|fdk-aac|mp3lame)[.-]"
)
FFMPEG_LIBRARIES = (
    "avcodec",
    "avformat",
    "avutil",
    "avfilter",
    "avdevice",
    "swscale",
    "swresample",
)
BAD_CONFIGURATION = re.compile(r"--enable-(gpl|nonfree|libx264|libx265|libxvid|libfdk)")


def shared_objects(roots: list[pathlib.Path]) -> list[pathlib.Path]:
    found = []
    for root in roots:
        for path in root.rglob("*.so*"):
            if path.is_file() and not path.is_symlink():
                with path.open("rb") as file:
                    if file.read(4) == b"\x7fELF":
                        found.append(path)
    return found


def resolved(path: pathlib.Path) -> dict[str, str]:
    """What the dynamic linker loads for ``path``: soname -> file."""
    out = subprocess.run(["ldd", str(path)], capture_output=True, text=True, check=False).stdout
    libraries = {}
    for line in out.splitlines():
        match = re.match(r"\s*(\S+) => (\S+)", line)
        if match:
            libraries[match[1]] = match[2]
    return libraries


def main() -> int:
    args = sys.argv[1:]
    ffmpeg_only = "--ffmpeg-only" in args
    roots = [pathlib.Path(a) for a in args if not a.startswith("--")]
    roots = roots or [pathlib.Path("/app/.venv")]
    problems: list[str] = []
    loaded: dict[str, str] = {}
    objects = shared_objects([r for r in roots if r.exists()])
    linked_by: dict[str, list[pathlib.Path]] = {}
    for path in objects:
        if GPL_LIBRARIES.search(path.name):
            problems.append(f"a GPL library in the image: {path}")
        for soname, target in resolved(path).items():
            if "not found" in target:
                continue
            loaded[soname] = target
            if GPL_LIBRARIES.search(soname):
                linked_by.setdefault(soname, []).append(path)
    for library, users in sorted(linked_by.items()):
        problems.append(f"{len(users)} shared objects ({users[0]} first) link {library} (GPL)")
    for bundle in (p for r in roots if r.exists() for p in r.rglob("av.libs")):
        problems.append(f"the PyPI wheel's bundled libraries are here: {bundle}")

    import av  # noqa: F401  (PyAV must import, and its FFmpeg is what is checked)

    ffmpeg = {
        name: target
        for soname, target in loaded.items()
        for name in FFMPEG_LIBRARIES
        if re.match(rf"lib{name}[-.]", soname)
    }
    for name in FFMPEG_LIBRARIES:
        if name not in ffmpeg:
            problems.append(f"no lib{name} linked by anything under {roots}")
            continue
        shared = ctypes.CDLL(ffmpeg[name])
        said = {}
        for what in ("license", "configuration"):
            function = getattr(shared, f"{name}_{what}")
            function.restype = ctypes.c_char_p
            said[what] = function().decode()
        if not said["license"].startswith("LGPL"):
            problems.append(f"{ffmpeg[name]}: {name}_license() is {said['license']!r}")
        if BAD_CONFIGURATION.search(said["configuration"]):
            problems.append(f"{ffmpeg[name]} was configured with {said['configuration']!r}")
        print(f"check-no-gpl: {ffmpeg[name]}: {said['license']}")
    if not ffmpeg_only:
        for dist in importlib.metadata.distributions():
            meta = dist.metadata
            # A License field of more than a name is the texts of bundled parts: not a verdict.
            named = meta["License-Expression"] or (meta["License"] or "")[:200]
            terms = " ".join([named, *(meta.get_all("Classifier") or [])])
            terms = re.sub("Lesser General Public", "", terms, flags=re.I)
            if re.search(r"(?<!L)GPL|General Public", terms, re.I):
                problems.append(f"a Python distribution that declares the GPL: {meta['Name']}")
        for root in roots:
            if root.exists():
                problems += [f"espeak-ng's data: {p}" for p in root.rglob("espeak-ng-data")]
    for problem in problems:
        print(f"check-no-gpl: {problem}", file=sys.stderr)
    if problems:
        return 1
    print(f"check-no-gpl: {len(objects)} shared objects, {len(loaded)} libraries they load: no GPL")
    return 0


if __name__ == "__main__":
    sys.exit(main())

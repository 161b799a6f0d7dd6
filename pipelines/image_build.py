"""Building the project's images (images/*.Dockerfile, tagged as images/versions.yaml says) with docker buildx
where a Docker engine answers, else with podman.

`local=True` builds for a machine that cannot pull the NGC and Docker Hub bases: a Debian bookworm made by
debootstrap from the mirror apt uses, the tools image on it and the gate image on that (versions.yaml `local`).
A podman build gets the host's pip configuration (what `pip config list` shows, written as one pip.conf), the
local files it names (wheel folders, file:// indexes, constraints) and its CA bundle as read-only mounts of its
RUN steps: pip behind a proxy with its own certificate works, and none of it stays in an image.

`build_model_image` builds a user's image: the tools image plus their model package (images/model.Dockerfile),
for the pipeline's export task (`model_image`) and their training."""

from __future__ import annotations

import dataclasses
import re
import shutil
import subprocess
import sys
import tempfile
import time
import tomllib
from collections.abc import Callable
from dataclasses import dataclass
from pathlib import Path

from components.errors import TritonshipError
from pipelines.images import MATRIX, REGISTRY_ENV, in_registry, matrix

ROOT = MATRIX.parents[1]
DEFAULT_MIRROR = "http://deb.debian.org/debian"
# What the local base adds to debootstrap's minbase: a python3 (3.11 on bookworm) that can make a venv, and the
# CA bundle pip reads.
BASE_PACKAGES = ("python3", "python3-venv", "ca-certificates")
BASE_PYTHON = "/opt/python"
BUILD_LOGS = ROOT / ".stack" / "image-builds"


class ImageBuildError(TritonshipError):
    """An image could not be built."""


@dataclass(frozen=True)
class ImageBuild:
    """One image: its Dockerfile, its tag and the build arguments versions.yaml gives it."""

    kind: str
    dockerfile: Path
    tag: str
    build_args: dict[str, str]
    context: Path = ROOT


def plan(local: bool = False, registry: str | None = None) -> list[ImageBuild]:
    """The images in build order: the NGC-based three, or (`local`) the tools image and the gate image on it;
    tagged in `registry` where one is given."""
    builds = _plan(local)
    tags = {b.tag: in_registry(b.tag, registry) for b in builds}
    return [
        dataclasses.replace(b, tag=tags[b.tag], build_args={k: tags.get(v, v) for k, v in b.build_args.items()})
        for b in builds
    ]


def _plan(local: bool) -> list[ImageBuild]:
    m = matrix()
    torch = {"TORCH": m["tools_torch"], "TORCH_INDEX": m["tools_torch_index"]}
    if local:
        tools, gate = m["local"]["images"]["tools"], m["local"]["images"]["gate"]
        return [
            ImageBuild(
                "tools",
                ROOT / "images/tools.Dockerfile",
                tools,
                {"BASE": m["local"]["base"], **torch, "TORCH_INDEX": m["local"]["torch_index"]},
            ),
            ImageBuild(
                "gate",
                ROOT / "images/gate-local.Dockerfile",
                gate,
                {"BASE": tools, "PERF_ANALYZER": m["local"]["perf_analyzer"]},
            ),
        ]
    return [
        ImageBuild(kind, ROOT / f"images/{kind}.Dockerfile", m["images"][kind], {"BASE": m["base"][kind]} | extra)
        for kind, extra in (("compile", {"TORCH": m["serving_torch"]}), ("gate", {}), ("tools", torch))
    ]


def engine() -> str:
    """docker where a Docker engine answers, else podman; one plain error where neither is here."""
    if shutil.which("docker") and _quiet(["docker", "info"]):
        return "docker"
    if shutil.which("podman"):
        return "podman"
    raise ImageBuildError(
        "neither a Docker engine nor podman is here; install podman (bash scripts/setup.sh --containers does) "
        "or start Docker, then build again."
    )


def image_exists(engine_name: str, tag: str) -> bool:
    return _quiet([engine_name, "image", "inspect", tag])


def image_size(engine_name: str, tag: str) -> int:
    """The image's size in bytes, as the engine reports it."""
    out = subprocess.run(
        [engine_name, "image", "inspect", "--format", "{{.Size}}", tag], capture_output=True, text=True, check=True
    )
    return int(out.stdout.strip())


def build_local_base(engine_name: str, mirror: str | None = None, log: Callable[[str], None] = print) -> float:
    """The local base image (debootstrap's minbase of versions.yaml's suite, python3 in a venv on the PATH),
    unless it exists; the seconds it took (0 when it existed)."""
    tag, suite = matrix()["local"]["base"], matrix()["local"]["debian_suite"]
    if image_exists(engine_name, tag):
        return 0.0
    if not shutil.which("debootstrap"):
        raise ImageBuildError("debootstrap is not installed; run `bash scripts/setup.sh --containers` first.")
    started = time.monotonic()
    mirror = mirror or apt_mirror()
    with tempfile.TemporaryDirectory(prefix="tritonship-rootfs-") as rootfs:
        log(f"images: debootstrap {suite} from {mirror}")
        _run(
            ["debootstrap", "--variant=minbase", f"--include={','.join(BASE_PACKAGES)}", suite, rootfs, mirror],
            f"debootstrap of {suite} from {mirror} failed",
        )
        _run(["chroot", rootfs, "python3", "-m", "venv", BASE_PYTHON], "making the base's python venv failed")
        for leftover in ("var/cache/apt/archives", "var/lib/apt/lists"):
            for path in (Path(rootfs) / leftover).glob("*"):
                if path.is_file():
                    path.unlink()
        path = f"{BASE_PYTHON}/bin:/usr/local/sbin:/usr/local/bin:/usr/sbin:/usr/bin:/sbin:/bin"
        tar = subprocess.Popen(["tar", "-C", rootfs, "-c", "."], stdout=subprocess.PIPE)
        imported = subprocess.run(
            [engine_name, "import", "--change", f"ENV PATH={path}", "--change", 'CMD ["/bin/bash"]', "-", tag],
            stdin=tar.stdout,
            capture_output=True,
            text=True,
        )
        tar.wait()
        if imported.returncode or tar.returncode:
            raise ImageBuildError(f"importing the local base as {tag} failed: {_last_line(imported.stderr)}")
    return time.monotonic() - started


def apt_mirror() -> str:
    """The Debian mirror this machine's apt uses (its first non-security source), else deb.debian.org."""
    for sources in sorted(Path("/etc/apt/sources.list.d").glob("*.sources")):
        for uri in re.findall(r"^URIs:\s*(\S+)", sources.read_text(), re.M):
            if "security" not in uri:
                return uri
    listing = Path("/etc/apt/sources.list")
    if listing.exists():
        for uri in re.findall(r"^deb\s+(?:\[[^]]*\]\s+)?(\S+)", listing.read_text(), re.M):
            if "security" not in uri:
                return uri
    return DEFAULT_MIRROR


def host_pip_mounts(workdir: Path) -> list[str]:
    """podman build's `-v` arguments that give its RUN steps this host's pip configuration: one pip.conf made of
    `pip config list` (files and PIP_* variables) at /etc/pip.conf, and every local path it names, read-only."""
    listed = subprocess.run(
        [sys.executable, "-m", "pip", "config", "list"], capture_output=True, text=True, check=False
    ).stdout
    sections: dict[str, dict[str, str]] = {}
    paths: set[str] = set()
    for line in listed.splitlines():
        match = re.fullmatch(r"([^.=]*)\.([^=]+)='(.*)'", line.strip())
        if not match:
            continue
        section, key, value = match.groups()
        if key == "config-file":  # PIP_CONFIG_FILE: which files were read, not a setting
            continue
        sections.setdefault("global" if section in ("", ":env:") else section, {})[key] = value
        for token in value.split():
            path = token.removeprefix("file://")
            if path.startswith("/") and Path(path).exists():
                # a file index (<root>/simple) links its files from beside it: mount its root
                paths.add(
                    str(Path(path).parent) if token.startswith("file://") and Path(path).name == "simple" else path
                )
    if not sections:
        return []
    conf = workdir / "pip.conf"
    conf.write_text(
        "".join(f"[{name}]\n" + "".join(f"{k} = {v}\n" for k, v in keys.items()) for name, keys in sections.items())
    )
    mounts = [f"{conf}:/etc/pip.conf:ro"] + [f"{p}:{p}:ro" for p in sorted(paths)]
    return [arg for mount in mounts for arg in ("-v", mount)]


def build(image: ImageBuild, engine_name: str, push: bool = False, mounts: list[str] | None = None) -> float:
    """Build `image` with `engine_name` (cached layers reused); the seconds it took."""
    args = [f"--build-arg={k}={v}" for k, v in (image.build_args | {"IMAGE": image.tag}).items()]
    if engine_name == "docker":
        command = ["docker", "buildx", "build", "--platform", "linux/amd64", *args, "-t", image.tag]
        command += ["--push"] if push else ["--load"]
    else:
        command = ["podman", "build", "--layers", *args, *(mounts or []), "-t", image.tag]
    started = time.monotonic()
    BUILD_LOGS.mkdir(parents=True, exist_ok=True)
    log_file = BUILD_LOGS / f"{image.dockerfile.stem}.log"
    with log_file.open("w") as output:
        built = subprocess.run(
            [*command, "-f", str(image.dockerfile), str(image.context)],
            stdout=output,
            stderr=subprocess.STDOUT,
            check=False,
        )
    if built.returncode:
        raise ImageBuildError(
            f"building {image.tag} failed (exit {built.returncode}): {_last_line(log_file.read_text())}; "
            f"the whole build output is in {log_file}."
        )
    if push and engine_name == "podman":
        _run(["podman", "push", image.tag], f"pushing {image.tag} failed")
    return time.monotonic() - started


def build_all(
    local: bool, push: bool = False, log: Callable[[str], None] = print, registry: str | None = None
) -> dict[str, dict[str, float]]:
    """Build every image of the plan (and the local base first, where `local`); per tag, its build seconds and
    size in MB."""
    engine_name = engine()
    report: dict[str, dict[str, float]] = {}
    with tempfile.TemporaryDirectory(prefix="tritonship-build-") as workdir:
        mounts = host_pip_mounts(Path(workdir)) if engine_name == "podman" else []
        if local:
            base = matrix()["local"]["base"]
            seconds = build_local_base(engine_name, log=log)
            report[base] = {"seconds": round(seconds, 1), "mb": round(image_size(engine_name, base) / 1e6)}
        for image in plan(local, registry):
            log(f"images: building {image.tag} ({image.dockerfile.name}) with {engine_name}")
            seconds = build(image, engine_name, push, mounts)
            report[image.tag] = {"seconds": round(seconds, 1), "mb": round(image_size(engine_name, image.tag) / 1e6)}
            log(f"images: {image.tag} in {seconds:.0f} s, {report[image.tag]['mb']:.0f} MB")
    return report


# ------------------------------------------------------------------------------ the user's model image
MODEL_IMAGE_BASES = ("tools", "compile")  # the export task's image (model_image), the compile task's (compile_image)
SOURCE_LEFT_OUT = (".git", ".venv", "__pycache__", "*.egg-info", "build", "dist", ".stack", ".tools")


def model_package_tag(package: Path, registry: str | None = None, on: str = "tools") -> str:
    """The default name of a model package's image: its distribution name (with -compile on the compile image) and
    version, in `registry` (else localhost), from a wheel's file name or a source folder's pyproject.toml."""
    if package.is_file() and package.suffix == ".whl":
        name, version = package.name.split("-")[:2]
    elif (package / "pyproject.toml").is_file():
        project = tomllib.loads((package / "pyproject.toml").read_text()).get("project", {})
        name, version = project.get("name"), project.get("version")
        if not (name and isinstance(version, str)):
            raise ImageBuildError(
                f"{package}/pyproject.toml names no [project] name and version; give the image's name with --tag."
            )
    else:
        raise ImageBuildError(
            f"--model-package {package} is neither a wheel (.whl) nor a folder with a pyproject.toml; give one of them."
        )
    repository = re.sub(r"[^a-z0-9.]+", "-", name.lower()) + ("-compile" if on == "compile" else "")
    tag = re.sub(r"[^\w.-]", "-", version)  # a version such as 1.0+cpu is no image tag: 1.0-cpu
    return in_registry(f"localhost/{repository}:{tag}", registry)


def build_model_image(
    package: Path,
    local: bool,
    push: bool = False,
    registry: str | None = None,
    tag: str | None = None,
    log: Callable[[str], None] = print,
    on: str = "tools",
) -> tuple[str, dict[str, float]]:
    """The tools image, or the compile image (`on`), with the user's model package installed: a source folder or a
    wheel. Where `local`, on the local tools image, in which the local runs compile too. Its tag and its build
    seconds and size in MB."""
    if on not in MODEL_IMAGE_BASES:
        raise ImageBuildError(f"--on {on} is not one of {', '.join(MODEL_IMAGE_BASES)}; give one of them.")
    package = package.resolve()
    if not package.exists():
        raise ImageBuildError(f"--model-package {package} does not exist; give a source folder or a wheel.")
    tag = tag or model_package_tag(package, registry, on)
    if push and tag.startswith("localhost/"):
        raise ImageBuildError(
            f"--push of {tag} needs a registry to push to; give --registry (or {REGISTRY_ENV}) or --tag."
        )
    tools = next(b for b in plan(local, registry) if b.kind == ("tools" if local else on)).tag
    engine_name = engine()
    if local and not image_exists(engine_name, tools):
        raise ImageBuildError(f"the tools image {tools} is not here; build it first (bash scripts/images.sh --local).")
    with tempfile.TemporaryDirectory(prefix="tritonship-model-image-") as workdir:
        context = Path(workdir) / "context"
        if package.is_file():
            (context / "package").mkdir(parents=True)
            shutil.copy2(package, context / "package" / package.name)
        else:
            shutil.copytree(package, context / "package", ignore=shutil.ignore_patterns(*SOURCE_LEFT_OUT))
        image = ImageBuild("model", ROOT / "images/model.Dockerfile", tag, {"BASE": tools}, context)
        mounts = host_pip_mounts(Path(workdir)) if engine_name == "podman" else []
        log(f"images: building {tag} ({package.name} on {tools}) with {engine_name}")
        seconds = build(image, engine_name, push, mounts)
    return tag, {"seconds": round(seconds, 1), "mb": round(image_size(engine_name, tag) / 1e6)}


def _quiet(command: list[str]) -> bool:
    return subprocess.run(command, capture_output=True, check=False).returncode == 0


def _run(command: list[str], failure: str) -> None:
    result = subprocess.run(command, capture_output=True, text=True, check=False)
    if result.returncode:
        raise ImageBuildError(f"{failure} (exit {result.returncode}): {_last_line(result.stderr or result.stdout)}.")


def _last_line(text: str | None) -> str:
    lines = [line for line in (text or "").splitlines() if line.strip()]
    return lines[-1].strip() if lines else "no output"

"""The release pipeline's tasks in the project's images under KFP's DockerRunner, through any Docker API: a
Docker engine's, or podman's (`podman system service`, started here for the run where nothing else answers).

kfp 2.17's runner needs four fixes for that (docs/design.md section 5), made in `ContainerTasks.run`,
which stands in for kfp's `run_docker_container` while a run lasts:
- kfp starts a task with auto-remove and asks for its exit code after; podman has removed it by then (a 500),
  and where the wait gets a 404 kfp reports exit code 0, so a failed task could pass. Here a task runs without
  auto-remove, its log streams, its own exit code decides, and then it is removed.
- kfp creates a task's output folders as root; the images run as their own user (uid 10001). The run's folders
  are handed to the image's user before each task.
- the tasks reach the embedded stack on the host's loopback (host network) and get the run's environment (S3
  credentials, the admin key) as container environment, never as pipeline parameters.
- a task whose image is a pipeline parameter (`set_container_image`: the export and compile tasks' `model_image`
  and `compile_image`) is handed the parameter's placeholder as its image, which Kubeflow's backend resolves and
  kfp's local runner does not. It is resolved here from the task's own inputs.
"""

from __future__ import annotations

import contextlib
import json
import os
import re
import shutil
import subprocess
import tempfile
import time
from collections.abc import Iterator
from dataclasses import dataclass, field
from pathlib import Path
from typing import TYPE_CHECKING, Any

from components.errors import TritonshipError
from pipelines.images import matrix

if TYPE_CHECKING:
    import docker
    from kfp.local import DockerRunner

API_START_TIMEOUT_S = 30.0
IMAGE_PARAMETER = re.compile(r"\{\{\$\.inputs\.parameters\['([^']+)'\]\}\}")


class ContainerRunError(TritonshipError):
    """A pipeline task could not be run in its container."""


def local_images() -> dict[str, str]:
    """The pipeline's images mapped to the local builds (images/versions.yaml `local`): the compile tasks run in
    the local tools image, which compiles the CPU targets."""
    images, built = matrix()["images"], matrix()["local"]["images"]
    return {images["tools"]: built["tools"], images["compile"]: built["tools"], images["gate"]: built["gate"]}


@dataclass
class ContainerTasks:
    """How each task's container is run: the image it really runs (`images` maps the pipeline's names to the
    builds here) and the environment it gets."""

    images: dict[str, str] = field(default_factory=dict)
    env: dict[str, str] = field(default_factory=dict)

    def run(
        self,
        client: docker.DockerClient,
        image: str,
        command: list[str],
        volumes: dict[str, Any],
        **container_run_args: Any,
    ) -> int:
        import docker

        image = resolved_image(image, command)
        image = self.images.get(image, image)
        try:
            user = client.images.get(image).attrs["Config"].get("User") or ""
        except docker.errors.ImageNotFound:
            raise ContainerRunError(
                f"the image {image} is not here; build it (tritonship images build) or pull it, and run again."
            ) from None
        for host_path in volumes:
            _hand_folders_to(Path(host_path), user)
        environment = {**self.env, **(container_run_args.pop("environment", None) or {})}
        container_run_args.pop("auto_remove", None)
        container = client.containers.run(
            image=image,
            command=command,
            detach=True,
            volumes=volumes,
            environment=environment,
            network_mode="host",
            **container_run_args,
        )
        try:
            for line in container.logs(stream=True, follow=True):
                print(line.decode(errors="replace"), end="")
            return int(container.wait()["StatusCode"])
        finally:
            container.remove(force=True)


def resolved_image(image: str, command: list[str]) -> str:
    """`image`, or where it is a parameter's placeholder, that parameter's value in the task's executor input."""
    parameter = IMAGE_PARAMETER.fullmatch(image)
    if not parameter:
        return image
    executor_input = json.loads(command[command.index("--executor_input") + 1])
    value = executor_input["inputs"]["parameterValues"].get(parameter[1])
    if not value:
        raise ContainerRunError(f"the task's image is the parameter {parameter[1]}, which is empty; give an image.")
    return value


def _hand_folders_to(root: Path, user: str) -> None:
    """Every folder under `root` owned by the image's numeric `user` (uid or uid:gid), so the task can write its
    outputs; nothing to do for an image that runs as root or names its user."""
    uid, _, gid = user.partition(":")
    if not uid.isdigit() or uid == "0":
        return
    owner = (int(uid), int(gid) if gid.isdigit() else int(uid))
    for folder in [root, *(p for p in root.rglob("*") if p.is_dir())]:
        if (folder.stat().st_uid, folder.stat().st_gid) != owner:
            os.chown(folder, *owner)


@contextlib.contextmanager
def docker_api() -> Iterator[None]:
    """DOCKER_HOST pointing at a Docker API for the block: the one set or the engine's socket where one answers,
    else podman's, started for the block on a socket of its own and stopped after."""

    if _api_answers():  # DOCKER_HOST, or /var/run/docker.sock
        yield
        return
    if not shutil.which("podman"):
        raise ContainerRunError(
            "no Docker API answers and podman is not installed; run `bash scripts/setup.sh --containers` "
            "or point DOCKER_HOST at a Docker engine."
        )
    with tempfile.TemporaryDirectory(prefix="tritonship-podman-") as folder:
        socket = Path(folder) / "podman.sock"
        service = subprocess.Popen(
            ["podman", "system", "service", "--time=0", f"unix://{socket}"],
            stdout=subprocess.DEVNULL,
            stderr=subprocess.DEVNULL,
        )
        saved = os.environ.get("DOCKER_HOST")
        os.environ["DOCKER_HOST"] = f"unix://{socket}"
        try:
            _wait_for_api(service)
            yield
        finally:
            service.terminate()
            service.wait(timeout=30)
            if saved is None:
                os.environ.pop("DOCKER_HOST", None)
            else:
                os.environ["DOCKER_HOST"] = saved


def _api_answers() -> bool:
    import docker

    try:
        with contextlib.closing(docker.from_env()) as client:
            return bool(client.ping())
    except docker.errors.DockerException:
        return False


def _wait_for_api(service: subprocess.Popen[bytes]) -> None:
    deadline = time.monotonic() + API_START_TIMEOUT_S
    while time.monotonic() < deadline:
        if service.poll() is not None:
            raise ContainerRunError(f"podman system service exited with {service.returncode}; run `podman info`.")
        if _api_answers():
            return
        time.sleep(0.2)
    raise ContainerRunError(f"podman's Docker API did not answer within {API_START_TIMEOUT_S:.0f} s.")


@contextlib.contextmanager
def docker_runner(env: dict[str, str], images: dict[str, str]) -> Iterator[DockerRunner]:
    """KFP's DockerRunner with `ContainerTasks(images, env)` running its tasks, through a Docker API, for the
    block."""
    import docker
    from kfp.local import DockerRunner, docker_task_handler

    tasks = ContainerTasks(images, env)
    original = docker_task_handler.run_docker_container
    with docker_api():
        with contextlib.closing(docker.from_env()) as client:
            for image in sorted(set(images.values())):
                try:
                    client.images.get(image)
                except docker.errors.ImageNotFound:
                    raise ContainerRunError(
                        f"the image {image} is not here; build it (bash scripts/images.sh --local) and run again."
                    ) from None
        docker_task_handler.run_docker_container = tasks.run
        try:
            yield DockerRunner()
        finally:
            docker_task_handler.run_docker_container = original

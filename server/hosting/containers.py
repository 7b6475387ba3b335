"""The ``podman`` and ``docker`` backends: the agent in a container, the evaluator in the work-horse.

The container reaches nothing but its evaluation's own Redis (private_redis.py), through the unix
socket mounted at ``SOCKET_MOUNT``, as the participant's Redis user: it has no network at all
(``--network none``: loopback only). Its root file system is read-only but for a scratch tmpfs
at ``SCRATCH`` (also its ``HOME``); it runs as ``AGENT_USER``, with no capability and no way to
gain privileges, within the competition's ``[hosting]`` CPUs, memory (swap included) and
processes, and its GPUs if it has any. The submission's working folder is mounted read-only at
``WORKDIR_MOUNT``; the test data, the results root and every other submission's folder are not
mounted. flatland's unmodified client, which knows only TCP, reaches the socket through the
socket bridge (client/socket_bridge.py), started in the container before the agent command.

A container is named ``arbiter-<submission id>-<attempt>`` and labelled with the submission's id;
it is removed when its evaluation ends, or when the worker kills the work-horse evaluating it
(``abandon``), and before an attempt starts, every container an earlier attempt of the
submission left on this machine (its worker was lost) is removed.

The image is the submission's (``arbiter submit --image``), else the competition's
(``[hosting] image``); ``rootfs:PATH`` (podman only) runs the agent on the worker machine's own
files under PATH, overlaid and read-only (podman's ``--rootfs PATH:O``): the agent sees what
the machine shows every user, except the folders arbiter hides from it (``hidden_folders``).
"""

from __future__ import annotations

import logging
import os
import shutil
import stat
import subprocess
import sys
import threading
from dataclasses import dataclass, field

from arbiter.protocol.errors import ConfigError
from arbiter.server.cli.runner import AgentProcess
from arbiter.server.core.competition import CompetitionSpec, HostingPolicy
from arbiter.server.formats import get_format
from arbiter.server.hosting.backends import (
    Evaluated,
    bridge_command,
    evaluated,
    prepare_attempt,
    private_redis,
    run_attempt,
)
from arbiter.server.hosting.container_endings import how_it_ended
from arbiter.server.hosting.submissions import Submission

log = logging.getLogger(__name__)

ENGINES = ("podman", "docker")
ROOTFS_PREFIX = "rootfs:"
SOCKET_MOUNT = "/run/arbiter"  # the folder of the evaluation's Redis socket, in the container
WORKDIR_MOUNT = "/submission"  # the submission's working folder, in the container
SCRATCH = "/tmp"  # the one writable folder
AGENT_USER = "10001:10001"  # the agent-base image's user (docker/agent-base.Dockerfile)
SUBMISSION_LABEL = "arbiter.submission"
ATTEMPT_LABEL = "arbiter.attempt"
BRIDGE_LISTEN = "127.0.0.1:6379"  # where flatland's client looks: its own loopback
IMAGE_PYTHON = "python3"  # the bridge's interpreter in an image (arbiter installed there)
ENGINE_CALL_TIMEOUT_S = 60.0  # an engine command that takes longer is a hung engine
HIDDEN_FOLDER_BYTES = 4096  # the size of the empty tmpfs that hides a folder


@dataclass(frozen=True)
class ContainerSpec:
    """Everything one agent container is made of (``run_arguments`` turns it into arguments)."""

    engine: str
    name: str
    submission_id: str
    attempt: int
    image: str
    command: list[str]
    hosting: HostingPolicy
    socket_folder: str
    workdir: str | None = None
    hidden_folders: list[str] = field(default_factory=list)
    environment: list[str] = field(default_factory=list)  # variable names, valued in the engine's environment
    extra_options: list[str] = field(default_factory=list)  # the worker's --container-option


def engine_prefix(engine: str, runtime: str | None) -> list[str]:
    """The engine's command with its global options (podman takes the runtime there)."""
    return [engine, "--runtime", runtime] if engine == "podman" and runtime else [engine]


def run_arguments(spec: ContainerSpec, runtime: str | None = None) -> list[str]:
    """``run`` and its options, the image and the command: what follows ``engine_prefix``."""
    podman = spec.engine == "podman"
    hosting = spec.hosting
    memory = str(hosting.memory_bytes)
    arguments = [
        "run",
        "--name", spec.name,
        "--label", f"{SUBMISSION_LABEL}={spec.submission_id}",
        "--label", f"{ATTEMPT_LABEL}={spec.attempt}",
        "--network", "none",
        "--read-only",
        "--user", AGENT_USER,
        "--cap-drop", "all",
        "--security-opt", "no-new-privileges",
        "--cpus", f"{hosting.cpus:g}",
        "--memory", memory,
        "--memory-swap", memory,  # the same: no swap beyond the memory
        "--pids-limit", str(hosting.pids),
        # The agent's output goes to agent.log through the attached run (agent_log.py); the engine
        # keeps no copy of it (a chatty agent would fill the engine's storage).
        "--log-driver", "none",
        "--pull", "never",  # pulled before the evaluation started (``ensure_image``)
        "--env", f"HOME={SCRATCH}",
        # The container runs the submission alone: the MetaLC runner may clear a fold's leavings.
        "--env", f"ARBITER_SOLE_TENANT={SCRATCH}",
        "--mount", _tmpfs(SCRATCH, "1777", hosting.memory_bytes, podman),
        "--mount", f"type=bind,source={spec.socket_folder},destination={SOCKET_MOUNT},readonly",
    ]  # fmt: skip
    if podman:
        arguments += ["--read-only-tmpfs=false"]  # SCRATCH alone is writable, not /run or /var/tmp
    elif runtime:
        arguments += ["--runtime", runtime]
    for name in spec.environment:
        arguments += ["--env", name]  # valued from the engine's environment: no secret on a command line
    if spec.workdir is not None:
        arguments += ["--mount", f"type=bind,source={spec.workdir},destination={WORKDIR_MOUNT},readonly"]
        arguments += ["--workdir", WORKDIR_MOUNT]
    for path in spec.hidden_folders:
        # A folder under an empty tmpfs, a file under an empty one (a tmpfs cannot cover a file).
        hiding = f"type=bind,source={os.devnull},destination={path},readonly" if os.path.isfile(path) else None
        arguments += ["--mount", hiding or _tmpfs(path, "0", HIDDEN_FOLDER_BYTES, podman)]
    arguments += gpu_arguments(spec.engine, hosting.gpus)
    arguments += spec.extra_options
    if spec.image.startswith(ROOTFS_PREFIX):
        arguments += ["--rootfs", f"{spec.image[len(ROOTFS_PREFIX) :]}:O"]
    else:
        arguments += [spec.image]
    return arguments + spec.command


def reachable_by_others(path: str) -> bool:
    """Whether a user other than the file's owner can reach ``path`` on this machine: every folder
    from the root down to it lets others through. The container's user, not root and without
    capabilities, reaches on the machine's own files only what such a user reaches, so a path
    that is not needs no hiding (and a mount over a folder on its way, such as a stand-in shown
    in its place, may leave no place to hide it in)."""
    current = os.path.abspath(path)
    folders = [current] if os.path.isdir(current) else []
    while current != os.path.dirname(current):
        current = os.path.dirname(current)
        folders.append(current)
    try:
        return all(os.stat(folder).st_mode & stat.S_IXOTH for folder in folders)
    except OSError:
        return False


def _tmpfs(destination: str, mode: str, size: int, podman: bool) -> str:
    # podman copies what the image has at the destination into a new tmpfs unless told not to:
    # on a rootfs, that would be the very folder the tmpfs hides.
    return f"type=tmpfs,destination={destination},tmpfs-mode={mode},tmpfs-size={size}" + (
        ",notmpcopyup" if podman else ""
    )


def gpu_arguments(engine: str, gpus: int) -> list[str]:
    """The first ``gpus`` GPUs of the machine: podman names them by CDI, docker counts them."""
    if gpus <= 0:
        return []
    if engine == "podman":
        return [argument for index in range(gpus) for argument in ("--device", f"nvidia.com/gpu={index}")]
    return ["--gpus", str(gpus)]


def container_name(submission: Submission) -> str:
    return f"arbiter-{submission.id}-{submission.attempts}"


def agent_image(spec: CompetitionSpec, submission: Submission, engine: str) -> str:
    """The submission's image, else the competition's; none is the agent's fault, said at once.
    The competition's image is the organiser's: one this engine cannot run is the farm's fault."""
    image = submission.image or spec.hosting.image
    if not image:
        raise ConfigError(
            f"cannot start the agent: the {engine} backend runs every agent in a container, and neither the "
            "submission (arbiter submit --image IMAGE) nor the competition ([hosting] image) names an image"
        )
    if image.startswith(ROOTFS_PREFIX) and engine != "podman":
        problem = f"image {image!r} (the machine's own files) needs the podman backend"
        raise ConfigError(f"cannot start the agent: {problem}" if submission.image else f"[hosting] {problem}")
    return image


def _engine_call(prefix: list[str], *arguments: str) -> subprocess.CompletedProcess:
    try:
        return subprocess.run(
            [*prefix, *arguments], capture_output=True, text=True, timeout=ENGINE_CALL_TIMEOUT_S, check=False
        )
    except subprocess.TimeoutExpired:
        raise RuntimeError(
            f"{' '.join(prefix)} {arguments[0]} did not answer within {ENGINE_CALL_TIMEOUT_S:g} s"
        ) from None


def remove_command(prefix: list[str]) -> list[str]:
    """``rm`` that kills a running container at once: podman would first give it 10 s to stop
    (an agent that ignores SIGTERM takes them all), docker kills it."""
    return ["rm", "--force", "--time", "0"] if prefix[0] == "podman" else ["rm", "--force"]


def remove_containers(prefix: list[str], submission_id: str) -> list[str]:
    """Remove (killing them) the containers of ``submission_id`` on this machine; returns their ids."""
    listed = _engine_call(prefix, "ps", "--all", "--quiet", "--filter", f"label={SUBMISSION_LABEL}={submission_id}")
    if listed.returncode != 0:
        raise RuntimeError(f"cannot list containers: {listed.stderr.strip()}")
    found = listed.stdout.split()
    if found:
        removed = _engine_call(prefix, *remove_command(prefix), *found)
        if removed.returncode != 0 and "no such container" not in removed.stderr.lower():
            raise RuntimeError(f"cannot remove containers {found}: {removed.stderr.strip()}")
        log.warning("removed %d container(s) an earlier attempt of %s left", len(found), submission_id)
    return found


def ensure_image(prefix: list[str], engine: str, image: str, *, submitted: bool = True) -> None:
    """Pull ``image`` unless this machine has it; an image that cannot be had is the agent's fault
    when the submission named it (``submitted``), the farm's when it is the competition's."""
    if image.startswith(ROOTFS_PREFIX):
        return
    present = _engine_call(prefix, *(("image", "exists", image) if engine == "podman" else ("image", "inspect", image)))
    if present.returncode == 0:
        return
    try:
        pulled = subprocess.run([*prefix, "pull", image], capture_output=True, text=True, check=False)
    except OSError as exc:
        raise RuntimeError(f"cannot run {prefix[0]}: {exc}") from None
    if pulled.returncode != 0:
        reason = (pulled.stderr.strip().splitlines() or ["no reason given"])[-1]
        problem = f"image {image!r} cannot be pulled: {reason}"
        raise ConfigError(f"cannot start the agent: its {problem}" if submitted else f"[hosting] {problem}")


class ContainerAgent(AgentProcess):
    """The agent as ``podman run`` (or ``docker run``), attached: a process of the work-horse in
    a process group of its own, as a local agent is. A stop signal reaches the container through
    the engine (it passes signals on); killing the engine's process leaves the container, so
    ``kill`` removes it too.

    The engine runs in a folder of the attempt's own (``folder``): podman's monitor (conmon)
    writes an ``oom`` file into its working folder when the kernel kills the container's process
    for memory, which some podman versions (4.3) then read nowhere, reporting ``OOMKilled``
    false."""

    def __init__(
        self, command: list[str], env: dict[str, str], *, prefix: list[str], name: str, memory: str, folder: str
    ):
        super().__init__(command, env, cwd=folder)
        self.prefix, self.name, self.memory = prefix, name, memory
        self._ending_lock = threading.Lock()
        self._ending: tuple[str | None] | None = None  # ended_how's answer, once asked
        self._removed = False

    def ended_how(self, status: int) -> str | None:
        """Killed at its memory limit, or never started through the engine's own failure
        (container_endings.py). Asked once, before the container is removed."""
        with self._ending_lock:
            if self._ending is None:
                self._ending = (self._how_it_ended(status),)
            return self._ending[0]

    def _how_it_ended(self, status: int) -> str | None:
        def inspect(shown: str) -> str | None:
            try:
                inspected = _engine_call(self.prefix, "inspect", "--format", shown, self.name)
            except (OSError, RuntimeError):
                return None
            return inspected.stdout.strip() if inspected.returncode == 0 else None

        assert self.cwd is not None
        return how_it_ended(
            status,
            inspect,
            engine=self.prefix[0],
            memory=self.memory,
            engine_folder=self.cwd,
            interrupted=self.interrupted_at is not None,
        )

    def kill(self) -> None:
        if self.process is not None and not self._removed:
            super().kill()
            self.ended_how(self.process.returncode)  # asked before the container goes
            self._removed = True
            try:
                removed = _engine_call(self.prefix, *remove_command(self.prefix), self.name)
                if removed.returncode != 0 and "no such container" not in removed.stderr.lower():
                    log.error("container %s not removed: %s", self.name, removed.stderr.strip())
            except (OSError, RuntimeError) as exc:
                log.error("container %s not removed: %s", self.name, exc)


class ContainerBackend:
    """Agents in podman or docker containers on the worker's machine."""

    agent_outlives_horse = True  # the engine runs the container, not the horse

    def __init__(self, engine: str, *, runtime: str | None = None, options: list[str] | None = None):
        if engine not in ENGINES:
            raise ConfigError(f"unknown container engine {engine!r}; known: {', '.join(ENGINES)}")
        self.name = self.engine = engine
        self.runtime = runtime
        self.extra_options = list(options or [])
        self.prefix = engine_prefix(engine, runtime)

    def check(self) -> None:
        """The engine answers (``podman info``, docker's daemon): else a worker would fail every
        submission it takes."""
        if shutil.which(self.engine) is None:
            raise ConfigError(f"--backend {self.engine}: {self.engine} is not a program on PATH")
        try:
            shown = "{{.Host.OS}}" if self.engine == "podman" else "{{.OSType}}"
            answered = _engine_call(self.prefix, "info", "--format", shown)
        except RuntimeError as exc:
            raise ConfigError(f"--backend {self.engine}: {exc}") from None
        if answered.returncode != 0:
            reason = (answered.stderr.strip().splitlines() or ["no reason given"])[-1]
            raise ConfigError(f"--backend {self.engine}: `{' '.join(self.prefix)} info` fails: {reason}")

    def abandon(self, submission_id: str) -> None:
        """The engine's process dies with the horse, the container does not: it is removed."""
        try:
            remove_containers(self.prefix, submission_id)
        except (OSError, RuntimeError) as exc:
            log.error("the containers of %s were not removed: %s", submission_id, exc)

    def evaluate(self, spec: CompetitionSpec, submission: Submission, *, results_dir: str, resume: bool) -> Evaluated:
        image = agent_image(spec, submission, self.engine)
        remove_containers(self.prefix, submission.id)
        ensure_image(self.prefix, self.engine, image, submitted=bool(submission.image))
        attempt = prepare_attempt(spec, results_dir, resume)
        rootfs = image.startswith(ROOTFS_PREFIX)
        with private_redis(attempt, submission) as private:
            agent_variables = {
                "ARBITER_REDIS_URL": private.agent_url(f"{SOCKET_MOUNT}/{private.socket.name}"),
                "AICROWD_SUBMISSION_ID": submission.id,
                "redis_ip": BRIDGE_LISTEN.split(":")[0],
            }
            command = list(submission.agent)
            if get_format(attempt.spec.format).tcp_clients:
                command = bridge_command(sys.executable if rootfs else IMAGE_PYTHON, BRIDGE_LISTEN) + command
            container = ContainerSpec(
                engine=self.engine,
                name=container_name(submission),
                submission_id=submission.id,
                attempt=submission.attempts,
                image=image,
                command=command,
                hosting=attempt.spec.hosting,
                socket_folder=str(private.socket_folder),
                workdir=(
                    _mountable(submission.workdir, "cannot start the agent: its working folder")
                    if submission.workdir
                    else None
                ),
                # On the machine's own files, what an image would not hold is hidden.
                hidden_folders=[
                    _mountable(path, "a folder the agent must not see")
                    for path in (attempt.hidden_folders(private.socket_folder.parent) if rootfs else [])
                    if reachable_by_others(path)
                ],
                environment=sorted(agent_variables),
                extra_options=self.extra_options,
            )
            agent = ContainerAgent(
                [*self.prefix, *run_arguments(container, self.runtime)],
                {**os.environ, **agent_variables},
                prefix=self.prefix,
                name=container.name,
                memory=attempt.spec.hosting.memory,
                folder=str(private.attempt_folder("engine")),
            )
            outcome = run_attempt(attempt, submission, private, agent, resume)
        return evaluated(outcome, private)


def _mountable(path: str, what: str) -> str:
    """``path``, which a ``--mount`` can name: its fields are separated by commas."""
    if "," in path:
        raise ConfigError(f"{what} {path!r} holds a comma, which a container's mount cannot name")
    return path

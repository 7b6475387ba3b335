"""How an agent's container ended, in the words of its evaluation's cause, from the engine's exit
status and the engine's own record of the container (containers.py's ``ContainerAgent`` asks
once, before the container is removed).

The engine's exit status is the agent's own but for two cases. A SIGKILL that arbiter did not
send is the kernel's out-of-memory killer, which the engine or conmon confirms. And 125 is what
podman and docker exit with when they could not run the container at all (a mount missing, the
runtime broken): the farm's fault, which counts against no participant's quota and is said so
(job.py reads "internal error"). But an agent's own process may exit with 125 too, and the
engine passes that on unchanged: that is the agent's doing, whatever it played before, never a
free try. The engine's record tells the two apart: a container whose process ran has ended
``exited``, with that process's exit code; one the engine could not run never got so far.
"""

from __future__ import annotations

import os
from collections.abc import Callable

from arbiter.server.core.summary import killed_at_memory_limit

KILLED = 137  # the exit status of a container whose process was SIGKILLed
ENGINE_FAILED = 125  # podman's and docker's own failure, before the agent's command ran; or the agent's own
OOM_MARKER = "oom"  # what conmon writes into its working folder at an OOM kill
RAN_TO_ITS_END = "exited"  # ``State.Status`` of a container whose process ran and ended
STATE_FORMAT = "{{.State.Status}} {{.State.ExitCode}} {{.State.OOMKilled}}"


def how_it_ended(
    status: int,
    inspect: Callable[[str], str | None],
    *,
    engine: str,
    memory: str,
    engine_folder: str,
    interrupted: bool,
) -> str | None:
    """What the cause says of the agent's end, or None when its exit status says it all.
    ``inspect(format)``: the engine's record of the container in ``format``, None when the engine
    cannot tell; ``engine_folder``: where the engine ran (conmon's ``oom`` file);
    ``interrupted``: arbiter stopped the agent (its SIGKILL is arbiter's, not the kernel's)."""
    if status == 0:
        return None
    state, exit_code, oom_killed = ((inspect(STATE_FORMAT) or "").split() + ["", "", ""])[:3]
    if status == ENGINE_FAILED and not (state == RAN_TO_ITS_END and exit_code == str(ENGINE_FAILED)):
        # The farm's fault (job.py reads "internal error" so): no agent ran.
        return (
            f"internal error: {engine} could not run the agent's container (exit status {status}: "
            "its message is in agent.log)"
        )
    if oom_killed == "true" or os.path.exists(os.path.join(engine_folder, OOM_MARKER)):
        return killed_at_memory_limit(memory, confirmed=True)
    if status == KILLED and not interrupted:
        return killed_at_memory_limit(memory, confirmed=False)
    return None

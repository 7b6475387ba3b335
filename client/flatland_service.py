"""What ``RemoteClient`` needs against flatland-rl's own evaluation service, which sends no env
state and no budgets: the env is loaded from the participant's copy of the test folder."""

from __future__ import annotations

import os
from typing import Any

from arbiter.protocol.errors import ArbiterError
from arbiter.protocol.legacy.flatland_env import build_rail_env


def flatland_version() -> str:
    try:
        import flatland

        return str(flatland.__version__)
    except Exception:  # pragma: no cover - flatland is a dependency; keep the handshake going
        return "unknown"


def load_local_env(test_env_folder: str | None, env_file_path: Any, obs_builder: Any, *, record_steps: bool) -> Any:
    """The env named by flatland's ENV_CREATE reply, built from the participant's test folder."""
    from flatland.envs.persistence import RailEnvPersister

    if not test_env_folder:
        raise ArbiterError(
            "the evaluator sent no env state (it is flatland's own service): set AICROWD_TESTS_FOLDER "
            "or pass test_env_folder= to load the test files locally"
        )
    path = os.path.join(test_env_folder, str(env_file_path))
    if not os.path.exists(path):
        raise ArbiterError(f"test file {path} not found (AICROWD_TESTS_FOLDER={test_env_folder})")
    env_dict = RailEnvPersister.load_env_dict(path)
    return build_rail_env(env_dict, obs_builder=obs_builder, record_steps=record_steps)

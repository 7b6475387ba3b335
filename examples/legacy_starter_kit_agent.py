"""A NeurIPS 2020 starter-kit style agent, unmodified: flatland-rl's own FlatlandRemoteClient.

    arbiter run -- python examples/legacy_starter_kit_agent.py

The client connects to redis_ip:6379 and reads AICROWD_SUBMISSION_ID and
AICROWD_TESTS_FOLDER, which ``arbiter run`` sets for it.
"""

import numpy as np
from flatland.core.env_observation_builder import DummyObservationBuilder
from flatland.evaluators.client import FlatlandRemoteClient, TimeoutException

remote_client = FlatlandRemoteClient()
obs_builder = DummyObservationBuilder()
rng = np.random.default_rng(0)

while True:
    observation, info = remote_client.env_create(obs_builder_object=obs_builder)
    if not observation:
        break
    local_env = remote_client.env
    try:
        while True:
            action = {handle: int(rng.integers(0, 5)) for handle in range(local_env.get_num_agents())}
            observation, all_rewards, done, info = remote_client.env_step(action)
            if done["__all__"]:
                break
    except TimeoutException as err:
        print("Timeout:", err)

result = remote_client.submit()
if result.get("score") is None:
    print("submitted: no score")
else:
    print(f"submitted: score {result['score']:.6g}, secondary {result['score_secondary']:.6g}")

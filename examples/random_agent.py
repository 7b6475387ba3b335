"""A random agent written with arbiter's client.

    arbiter run -- python examples/random_agent.py

The connection settings come from the environment that ``arbiter run`` (or the hosted
evaluation) sets: ARBITER_REDIS_URL and AICROWD_SUBMISSION_ID.
"""

import numpy as np

from arbiter.client import RemoteClient, TimeoutException

rng = np.random.default_rng(0)  # seeded: the same run gives the same score
client = RemoteClient()

episode = 0
while True:
    observation, info = client.env_create()
    if not observation:  # (False, False): no episode left
        break
    episode += 1
    try:
        while True:
            actions = {handle: int(rng.integers(0, 5)) for handle in range(client.env.get_num_agents())}
            observation, rewards, done, info = client.env_step(actions)
            if done["__all__"]:
                break
    except TimeoutException as exc:  # the evaluator timed this episode out: go on with the next
        print(f"episode {episode}: timed out ({exc})")

result = client.submit()  # every figure is in the results folder; one line of them here
if result["score"] is None:
    print(f"submitted: no score ({result['arbiter']['state']})")
else:
    print(f"submitted: score {result['score']:.6g}, secondary {result['score_secondary']:.6g}")

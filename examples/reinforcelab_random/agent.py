"""A ReinforceLab agent that acts at random: the baseline a competition's board is read against.

    arbiter run --competition two-phase-cartpole -- python -m arbiter.client.reinforcelab examples/reinforcelab_random

The interface is ReinforceLab's (``Agent(env)``, ``act``, ``train``, ``load``, ``save``). It
learns nothing: ``train`` plays random episodes until the evaluator ends the run, so its
training never converges and its phase 2 runs are scored with the penalty.
"""

import numpy as np


class Agent:
    def __init__(self, env, seed=0):
        self.env = env
        self.rng = np.random.default_rng(seed)  # seeded: the same evaluation gives the same score

    def act(self, observation):
        return int(self.rng.integers(0, 2))

    def train(self):
        try:
            while True:
                self.env.reset()
                done = False
                while not done:
                    _, _, terminated, truncated, _ = self.env.step(self.act(None))
                    done = terminated or truncated
        except StopIteration:
            pass  # the evaluator ended the run

    def load(self):
        pass  # nothing learned, nothing to load

    def save(self):
        pass

"""A ReinforceLab agent for CartPole-v1, numpy only: a linear policy found by random search.

The interface is ReinforceLab's (``Agent(env)``, ``act``, ``train``, ``load``, ``save``), so the
same file runs under ReinforceLab's ingestion and under ``python -m arbiter.client.reinforcelab``.

- ``act(obs)``: push right when ``weights · obs > 0``.
- ``train()``: hill climbing on one episode's return. Random weights until one set scores at all,
  then the best set so far is played as long as it reaches the goal (that is what converging
  asks); when it falls short, sets near it (Gaussian noise) are tried, and the first that scores
  at least what it scored takes its place. It stops when the env raises ``StopIteration`` (the
  evaluator ended the run) or after ``max_episodes``.
- ``load()`` / ``save()``: the weights in ``weights.json`` next to this file (``train.py`` made
  the shipped one).
"""

import json
import os

import numpy as np

WEIGHTS_FILE = os.path.join(os.path.dirname(os.path.abspath(__file__)), "weights.json")


class Agent:
    def __init__(self, env, seed=0, goal=475.0, max_episodes=100_000):
        self.env = env
        self.rng = np.random.default_rng(seed)
        self.goal = goal
        self.max_episodes = max_episodes
        self.weights = self.rng.uniform(-1.0, 1.0, size=4)

    def act(self, observation):
        return int(np.dot(self.weights, observation) > 0)

    def play(self, weights):
        """One episode with ``weights``; its return."""
        observation, _ = self.env.reset()
        total, done = 0.0, False
        while not done:
            observation, reward, terminated, truncated, _ = self.env.step(int(np.dot(weights, observation) > 0))
            total += reward
            done = terminated or truncated
        return total

    def train(self, noise=0.5):
        best, best_return = None, -1.0
        try:
            for _ in range(self.max_episodes):
                if best is not None and best_return >= self.goal:
                    candidate = best  # it reaches the goal: play it again
                elif best is None:
                    candidate = self.rng.uniform(-1.0, 1.0, size=4)
                else:
                    candidate = best + self.rng.normal(0.0, noise, size=4)
                episode_return = self.play(candidate)
                if candidate is best:
                    best_return = episode_return  # short of the goal this time: search near it
                elif episode_return >= best_return:
                    best, best_return = candidate, episode_return
                    self.weights = best
        except StopIteration:
            pass  # the evaluator ended the run

    def load(self):
        with open(WEIGHTS_FILE, encoding="utf-8") as handle:
            self.weights = np.array(json.load(handle)["weights"], dtype=float)

    def save(self):
        with open(WEIGHTS_FILE, "w", encoding="utf-8") as handle:
            json.dump({"weights": [float(w) for w in self.weights]}, handle)

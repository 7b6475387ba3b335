"""A random-search MetaLC agent (starting-kit shape, class ``Agent``). It draws from Python's
``random`` only, which the evaluator seeds in both phases (208 in development, r + 1 for final
run r), so its figures are reproducible and check that seeding run by run.
"""

from __future__ import annotations

import random


class Agent:
    def __init__(self, number_of_algorithms):
        self.nA = number_of_algorithms

    def meta_train(
        self, dataset_meta_features, algorithms_meta_features, validation_learning_curves, test_learning_curves
    ):
        """Random search learns nothing from other datasets."""

    def reset(self, dataset_meta_features, algorithms_meta_features):
        self.budget = float(dataset_meta_features["time_budget"])
        self.last_scores = [0.0] * self.nA

    def suggest(self, observation):
        best = None
        if observation is not None:
            algorithm, _, score = observation
            self.last_scores[algorithm] = score
            best = max(range(self.nA), key=lambda a: (self.last_scores[a], -a))
        explore = random.randrange(self.nA)
        delta_t = random.randrange(1, 9) * self.budget / 16
        return (best, explore, delta_t)

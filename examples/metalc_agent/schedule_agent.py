"""A fixed-schedule MetaLC agent (starting-kit shape, class ``Agent``), deterministic and blind to
meta-training: it walks the algorithms 0, 1, 2, ... in turn, named by their integer index as the
kit's agents do, with a time slice that doubles after every full round, and credits the last
algorithm whose validation score beat the best seen so far.
"""

from __future__ import annotations


class Agent:
    def __init__(self, number_of_algorithms):
        self.nA = number_of_algorithms

    def meta_train(
        self, dataset_meta_features, algorithms_meta_features, validation_learning_curves, test_learning_curves
    ):
        """The schedule does not depend on other datasets: nothing to learn."""

    def reset(self, dataset_meta_features, algorithms_meta_features):
        self.slice = float(dataset_meta_features["time_budget"]) / (4 * self.nA)
        self.next_algorithm = 0
        self.best_algorithm = None
        self.best_score = 0.0

    def suggest(self, observation):
        if observation is not None:
            algorithm, _, score = observation
            if score > self.best_score:
                self.best_algorithm, self.best_score = algorithm, score
        explore = self.next_algorithm
        self.next_algorithm = (self.next_algorithm + 1) % self.nA
        delta_t = self.slice
        if self.next_algorithm == 0:
            self.slice *= 2
        return (self.best_algorithm, explore, delta_t)

"""A small deterministic MetaLC agent, shaped the way the challenge's starting kit shapes agents:
a class ``Agent`` in ``agent.py`` with ``__init__(number_of_algorithms)``, ``meta_train``, ``reset``
and ``suggest``.

Strategy (greedy, no randomness): meta-training ranks the algorithms by their mean final test
score over the meta-training datasets; on a new dataset the agent takes turns among the top
three, giving each a tenth of the budget per turn, and credits whichever has shown the best
validation score so far.
"""

from __future__ import annotations

TOP_K = 3
SLICES = 10  # delta_t is the budget over this


class Agent:
    def __init__(self, number_of_algorithms):
        """
        Parameters
        ----------
        number_of_algorithms : int
            How many algorithms the meta-dataset holds.
        """
        self.nA = number_of_algorithms
        self.ranking = []

    def meta_train(
        self, dataset_meta_features, algorithms_meta_features, validation_learning_curves, test_learning_curves
    ):
        """
        Rank the algorithms once per fold.

        Parameters
        ----------
        dataset_meta_features : dict of {str : dict of {str : str}}
            Meta-features of the meta-training datasets.
        algorithms_meta_features : dict of {str : dict of {str : str}}
            Meta-features of every algorithm, keyed by its name.
        validation_learning_curves, test_learning_curves : dict of {str : dict of {str : curve}}
            Curves of the meta-training datasets; a curve has ``.timestamps`` and ``.scores``.
        """
        names = sorted(algorithms_meta_features)
        datasets = sorted(test_learning_curves)
        mean_final = {}
        for name in names:
            total = 0.0
            for dataset in datasets:
                total += float(test_learning_curves[dataset][name].scores[-1])
            mean_final[name] = total / len(datasets) if datasets else 0.0
        self.ranking = sorted(names, key=lambda name: (-mean_final[name], name))

    def reset(self, dataset_meta_features, algorithms_meta_features):
        """
        Start a new dataset.

        Parameters
        ----------
        dataset_meta_features : dict of {str : str}
            Its meta-features; ``time_budget`` is the budget to spend.
        algorithms_meta_features : dict of {str : dict of {str : str}}
            Meta-features of every algorithm.
        """
        if not self.ranking:
            self.ranking = sorted(algorithms_meta_features)
        self.candidates = self.ranking[:TOP_K]
        self.delta_t = float(dataset_meta_features["time_budget"]) / SLICES
        self.turn = 0
        self.best_algorithm = None
        self.best_score = 0.0

    def suggest(self, observation):
        """
        Parameters
        ----------
        observation : tuple of (algorithm, float, float) or None
            The last step's explored algorithm, the time spent on it so far, and its validation
            score at that time; None before the first step.

        Returns
        ----------
        action : tuple of (algorithm or None, algorithm, float)
            The algorithm to credit, the algorithm to explore next, and the time to spend on it.
        """
        if observation is not None:
            algorithm, _, score = observation
            if score > self.best_score:
                self.best_algorithm, self.best_score = algorithm, score
        explore = self.candidates[self.turn % len(self.candidates)]
        self.turn += 1
        return (self.best_algorithm, explore, self.delta_t)

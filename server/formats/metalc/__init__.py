"""The MetaLC format: meta-learning from learning curves, round 1 (WCCI 2022), scored by the area
under the agent's learning curve (SCORING.md §4).

- ``data``: the meta-dataset folder, loaded exactly as the challenge loads it;
- ``env``: phases, runs and seeds, folds, meta-training data, one dataset's episode;
- ``scoring``: ALC, final scores, run averages and the final phase's worst run, from records;
- ``generate``: synthetic meta-datasets in the same layout;
- ``local``: a whole phase played in process with agent objects.
"""

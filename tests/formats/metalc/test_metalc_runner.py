"""The runner ``arbiter.client.metalc`` and its folds' processes playing the MetaLC plan against a
real evaluator (serving in this process, through a real redis-server); the end-to-end tests
(test_metalc_e2e.py) run ``arbiter run`` itself. Agents written here report what they saw on
stderr (their own processes' stderr is this one's), where ``capfd`` reads it."""

from __future__ import annotations

import json
import os
import random
import sys
import textwrap
from typing import Any

import numpy as np
import pytest
from harness import finish, read_episodes, running_service
from test_metalc_plan import AGENTS_DIR, SETTINGS, load_agent, make_plan

from arbiter.client import metalc as runner
from arbiter.client import metalc_fold
from arbiter.client.wire import Wire
from arbiter.protocol import codec
from arbiter.protocol.errors import InvalidAction
from arbiter.protocol.messages import EXTENSION_KEY
from arbiter.server.core.competition import load_competition
from arbiter.server.formats.metalc import FORMAT
from arbiter.server.formats.metalc.data import load_meta_dataset
from arbiter.server.formats.metalc.generate import write_meta_dataset
from arbiter.server.formats.metalc.local import play_phase
from arbiter.server.formats.metalc.options import MetaLCOptions
from arbiter.server.formats.metalc.scoring import phase_score


@pytest.fixture(scope="module")
def data_dir(tmp_path_factory):
    folder = tmp_path_factory.mktemp("metalc-runner") / "data"
    write_meta_dataset(str(folder), SETTINGS)
    return str(folder)


@pytest.fixture(scope="module")
def meta(data_dir):
    return load_meta_dataset(data_dir)


@pytest.fixture
def restore_process():
    """``play_phase`` seeds this process as the challenge seeded its own: undo it afterwards."""
    python_state, numpy_state = random.getstate(), np.random.get_state()
    yield
    random.setstate(python_state)
    np.random.set_state(numpy_state)


@pytest.fixture
def untouched_process():
    """The runner's own process never seeds, moves or imports the agent: checked afterwards."""
    before = (random.getstate(), repr(np.random.get_state()), os.getcwd(), list(sys.path), set(sys.modules))
    yield
    after = (random.getstate(), repr(np.random.get_state()), os.getcwd(), list(sys.path), set(sys.modules))
    assert after[:4] == before[:4]
    assert not {"agent", "random_agent", "schedule_agent"} & (after[4] - before[4])


# A test agent's base: one step per dataset, spending the whole budget on algorithm 0.
ONE_STEP = """
class OneStep:
    def __init__(self, number_of_algorithms):
        pass

    def meta_train(self, dataset_meta_features, algorithms_meta_features, validation, test):
        pass

    def reset(self, dataset_meta_features, algorithms_meta_features):
        self.budget = float(dataset_meta_features["time_budget"])

    def suggest(self, observation):
        return (None, 0, self.budget)
"""


def write_agent(folder: Any, body: str) -> None:
    """``folder/agent.py``: the OneStep base, then ``body`` (which may ``report(...)``)."""
    (folder / "agent.py").write_text(ONE_STEP + REPORT + textwrap.dedent(body))


REPORT_PREFIX = "agent-report "
REPORT = f"""
import json as _json
import sys as _sys


def report(*values):
    print({REPORT_PREFIX!r} + _json.dumps(values), file=_sys.stderr, flush=True)
"""


def reports(captured: str) -> list[list[Any]]:
    return [json.loads(line[len(REPORT_PREFIX) :]) for line in captured.splitlines() if line.startswith(REPORT_PREFIX)]


# -- a real evaluator: the runner, its folds' processes and the format's seam through Redis --------

ROOMY = ["budgets.idle_s=30", "budgets.overall_s=600"]


@pytest.fixture
def results_dir(tmp_path_factory):
    """Where the evaluator writes: outside the submission folder, which each fold copies."""
    return tmp_path_factory.mktemp("results")


def evaluate(
    data_dir: str, folder: str, *, redis_url: str, service_id: str, results: str, phase: str = "dev",
    agent_module: str = "agent",
) -> tuple[list[dict[str, Any]], dict[str, Any]]:  # fmt: skip
    """The phase played by the runner against an evaluator serving in this process; the records
    the evaluator wrote and its summary. An error of the runner is raised once the evaluator is
    stopped."""
    competition = load_competition("metalc-wcci2022", [f"phase={phase}", *ROOMY])
    with running_service(competition, tests=data_dir, results=results, redis_url=redis_url, service_id=service_id) as (
        _,
        outcome,
    ):
        wire = Wire(redis_url, service_id, reply_timeout_s=20)
        try:
            runner.run(folder, agent_module=agent_module, wire=wire)
        finally:
            wire.close()
        summary = finish(outcome)
    return read_episodes(results), summary


def figures(records: list[dict[str, Any]]) -> list[tuple[Any, ...]]:
    return [(r["run"], r["fold"], r["dataset"], r["alc"], r["final_score"], r["times"], r["scores"]) for r in records]


# -- the curves the agent gets ---------------------------------------------------------------------


def test_the_runner_rebuilds_every_curve_and_hands_missing_ones_over_as_lists(data_dir, meta):
    plan = make_plan(data_dir)
    wire = plan.open(plan.items[0]).create_payload()[EXTENSION_KEY]["meta_train"]
    wire = codec.decode(codec.encode(wire), codec.REPLY_LIMITS)
    assert wire["datasets"] == list(plan.folds[0].meta_train)
    for split, table, source in (("valid", "validation_learning_curves", meta.validation_curves),
                                 ("test", "test_learning_curves", meta.test_curves)):  # fmt: skip
        curves = metalc_fold.curves_from_wire(wire[table], wire["datasets"], list(meta.algorithms))
        assert list(curves) == wire["datasets"] and all(list(row) == list(meta.algorithms) for row in curves.values())
        for dataset, row in curves.items():
            for algorithm, curve in row.items():
                if (split, dataset, algorithm) in meta.missing_curves:
                    assert curve.timestamps == [0.0] and curve.scores == [0.0]
                    continue
                assert curve.timestamps.dtype == np.float64 and curve.scores.flags.writeable
                assert np.array_equal(curve.timestamps, source[dataset][algorithm].timestamps)
                assert np.array_equal(curve.scores, source[dataset][algorithm].scores)
    missing = [m for m in meta.missing_curves if m[1] not in plan.folds[0].meta_test]
    assert missing  # the set has missing curves in this fold's meta-training data


def test_the_runners_curve_reads_points_like_the_domains(meta):
    for dataset in meta.datasets[:4]:
        for algorithm, curve in meta.validation_curves[dataset].items():
            client = metalc_fold.LearningCurve(np.array(curve.timestamps), np.array(curve.scores))
            for counter in (0.0, *curve.timestamps[:3]):
                for delta_t in (0.0, 0.5, 7.3, 60.0, 5000.0):
                    got = client.get_last_point_within_delta_t(delta_t, counter)
                    assert tuple(map(float, got)) == curve.last_point_within(delta_t, counter), (dataset, algorithm)


# -- the runner through the seam, against the in-process phase ---------------------------------------


@pytest.mark.parametrize("agent,phase", [("agent", "dev"), ("schedule_agent", "final"), ("random_agent", "final")])
def test_the_runner_through_an_evaluator_scores_what_the_in_process_phase_scores(
    data_dir, meta, restore_process, agent, phase, redis_url, service_id, results_dir
):
    local = play_phase(meta, load_agent(agent), phase, seeding="fold")
    random.seed(1)  # the runner's process is left as it is: checked below
    before = random.getstate()
    records, summary = evaluate(data_dir, AGENTS_DIR, agent_module=agent, phase=phase, redis_url=redis_url,
                                service_id=service_id, results=str(results_dir / "r"))  # fmt: skip
    assert random.getstate() == before and summary["state"] == "SUCCESS"
    assert figures(records) == figures(local)
    expected = phase_score(local, phase)
    score = FORMAT.rules["alc"](MetaLCOptions(phase=phase)).aggregate(records)
    assert (score["primary"], score["secondary"]) == (expected.average_alc, expected.average_final_score)
    assert score["reported_run"] == expected.reported_run


def test_each_folds_agent_runs_in_a_fresh_copy_of_its_folder_seeded_as_a_run_starts(
    data_dir, untouched_process, tmp_path, capfd, redis_url, service_id, results_dir
):
    # An agent that reports Python's and numpy's next draws at import and at construction, and
    # where it runs.
    write_agent(
        tmp_path,
        """
        import os
        import random
        import numpy as np

        IMPORT_DRAW = random.random()

        class Agent(OneStep):
            def __init__(self, number_of_algorithms):
                report("init", IMPORT_DRAW, random.random(), float(np.random.random_sample()), os.getcwd(),
                       os.path.dirname(os.path.abspath(__file__)), sorted(os.listdir(".")))
        """,
    )
    evaluate(data_dir, str(tmp_path), redis_url=redis_url, service_id=service_id, results=str(results_dir / "r1"))
    seen = reports(capfd.readouterr().err)
    assert len(seen) == 6  # one process per fold
    development = random.Random(208)
    imported, constructed = development.random(), development.random()
    for _, import_draw, init_draw, _, cwd, module_dir, files in seen:
        assert (import_draw, init_draw) == (imported, constructed)  # seeded before the import, every fold
        assert cwd == module_dir != str(tmp_path) and files == ["agent.py"]
    assert len({cwd for *_, cwd, _, _ in seen}) == 6 and not any(os.path.exists(s[4]) for s in seen)

    evaluate(data_dir, str(tmp_path), phase="final", redis_url=redis_url, service_id=f"{service_id}f",
             results=str(results_dir / "r2"))  # fmt: skip
    seen = reports(capfd.readouterr().err)
    assert len(seen) == 18
    for run in range(3):
        expected = (random.Random(run + 1).random(), float(np.random.RandomState(run + 1).random_sample()))
        assert all((s[2], s[3]) == expected for s in seen[run * 6 : run * 6 + 6])  # seeded after the import


def test_an_action_the_evaluator_refuses_stops_the_runner(
    data_dir, untouched_process, tmp_path, redis_url, service_id, results_dir
):
    write_agent(
        tmp_path,
        """
        class Agent(OneStep):
            def suggest(self, observation):
                return (None, "no such algorithm", 1.0)
        """,
    )
    with pytest.raises(InvalidAction, match="run 0, dataset syn0: A 'no such algorithm' names no algorithm"):
        evaluate(data_dir, str(tmp_path), redis_url=redis_url, service_id=service_id, results=str(results_dir / "r"))


def test_meta_train_gets_the_challenges_arguments(
    data_dir, meta, untouched_process, tmp_path, capfd, redis_url, service_id, results_dir
):
    write_agent(
        tmp_path,
        """
        import numpy as np

        def curve_seen(curves):
            if "syn12" not in curves:  # the fold of syn12 meta-trains on the others
                return None
            curve = curves["syn12"]["3"]
            kinds = [type(curve.timestamps).__name__, str(curve.timestamps.dtype), curve.scores.flags.writeable]
            return [list(map(float, curve.timestamps)), list(map(float, curve.scores)), kinds]

        class Agent(OneStep):
            def __init__(self, number_of_algorithms):
                self.n = number_of_algorithms

            def meta_train(self, d, a, v, t):
                self.algorithms = a
                report("meta_train", self.n, d, a, list(v), list(t), curve_seen(v), curve_seen(t))

            def reset(self, d, a):
                report("reset", d, a is self.algorithms)
                super().reset(d, a)
        """,
    )
    evaluate(data_dir, str(tmp_path), redis_url=redis_url, service_id=service_id, results=str(results_dir / "r"))
    calls = reports(capfd.readouterr().err)
    _, n, datasets, algorithms, validation, test, valid_curve, test_curve = calls[0]
    fold0 = set(meta.datasets[:3])
    assert n == len(meta.algorithms)
    assert datasets == {d: meta.dataset_meta_features[d] for d in meta.datasets if d not in fold0}
    assert algorithms == meta.algorithms_meta_features
    assert validation == test == [d for d in meta.datasets if d not in fold0]
    curve = meta.validation_curves["syn12"]["3"]
    assert valid_curve == [curve.timestamps.tolist(), curve.scores.tolist(), ["ndarray", "float64", True]]
    assert test_curve[1] == meta.test_curves["syn12"]["3"].scores.tolist()
    assert calls[1] == ["reset", meta.dataset_meta_features["syn0"], True]  # one shared object
    assert sum(1 for c in calls if c[0] == "meta_train") == 6  # a fresh agent per fold

"""The runner ``arbiter.client.metalc`` driving the MetaLC plan through a stand-in for the evaluator
that calls the format's seam in order and passes every message through the wire codec; the
runner's fold processes are real. The end-to-end tests (test_metalc_e2e.py) do the same through a
real evaluator. Agents written here report what they saw on stderr (their own processes' stderr
is this one's), where ``capfd`` reads it."""

from __future__ import annotations

import json
import os
import random
import sys
import textwrap
from typing import Any

import numpy as np
import pytest
from test_metalc_plan import AGENTS_DIR, SETTINGS, load_agent, make_plan

from arbiter.client import metalc as runner
from arbiter.client import metalc_fold
from arbiter.protocol import codec
from arbiter.protocol.messages import EXTENSION_KEY, FLATLAND_RL
from arbiter.server.formats.metalc import FORMAT
from arbiter.server.formats.metalc.data import load_meta_dataset
from arbiter.server.formats.metalc.generate import write_meta_dataset
from arbiter.server.formats.metalc.local import play_phase
from arbiter.server.formats.metalc.options import MetaLCOptions
from arbiter.server.formats.metalc.plan import MetaLCPlan
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


# -- a stand-in for the evaluator: the seam's calls in order, every message through the codec ----


class SeamDriver:
    """Answers the runner's requests by calling the plan as the evaluator does (no budgets)."""

    def __init__(self, plan: MetaLCPlan):
        self.plan = plan
        self.next = 0
        self.open: Any = None
        self.invalid = 0
        self.records: list[dict[str, Any]] = []
        self.rule = FORMAT.rules["alc"](plan.options)

    def handshake(self, version: str, asks: dict[str, Any] | None = None) -> dict[str, Any]:
        assert asks == {"client": "arbiter.client.metalc", "formats": ["metalc"]}
        return self.request(FLATLAND_RL.PING, {"version": version})["payload"][EXTENSION_KEY]

    def request(self, type_: str, payload: dict[str, Any]) -> dict[str, Any]:
        payload = codec.decode(codec.encode(payload), codec.COMMAND_LIMITS)
        body = self._answer(type_, payload)
        answer = FLATLAND_RL.PONG if type_ == FLATLAND_RL.PING else f"{type_}_RESPONSE"
        return codec.decode(codec.encode({"type": answer, "payload": body}), codec.REPLY_LIMITS)

    def _answer(self, type_: str, payload: dict[str, Any]) -> dict[str, Any]:
        if type_ == FLATLAND_RL.PING:
            return {EXTENSION_KEY: {"protocol": 1, **self.plan.handshake(), "format": "metalc", "next": self.next}}
        if type_ == FLATLAND_RL.ENV_CREATE:
            if self.next == len(self.plan.items):
                return {EXTENSION_KEY: {"finished": True}}
            self.open = self.plan.open(self.plan.items[self.next])
            self.next += 1
            return self.open.create_payload()
        if type_ == FLATLAND_RL.ENV_STEP:
            clean, _ = self.open.sanitize(payload["action"])  # InvalidAction reaches the runner
            over = self.open.step(clean)
            reply = self.open.step_reply(0)
            if over:
                self.records += self.open.records(finished=True, timeout=None, abandoned=False)
                self.open.close()
            return reply
        if type_ == FLATLAND_RL.ENV_SUBMIT:
            return {"score": self.rule.aggregate(self.records)}
        raise AssertionError(type_)

    def close(self) -> None:
        pass


def drive(plan: MetaLCPlan, agent_module: str) -> SeamDriver:
    driver = SeamDriver(plan)
    runner.run(AGENTS_DIR, agent_module=agent_module, wire=driver)
    return driver


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
def test_the_runner_through_the_seam_scores_what_the_in_process_phase_scores(
    data_dir, meta, restore_process, agent, phase
):
    local = play_phase(meta, load_agent(agent), phase, seeding="fold")
    random.seed(1)  # the runner's process is left as it is: checked below
    before = random.getstate()
    driver = drive(make_plan(data_dir, phase=phase), agent)
    assert random.getstate() == before
    assert figures(driver.records) == figures(local)
    expected = phase_score(local, phase)
    score = FORMAT.rules["alc"](MetaLCOptions(phase=phase)).aggregate(driver.records)
    assert (score["primary"], score["secondary"]) == (expected.average_alc, expected.average_final_score)
    assert score["reported_run"] == expected.reported_run


def test_each_folds_agent_runs_in_a_fresh_copy_of_its_folder_seeded_as_a_run_starts(
    data_dir, untouched_process, tmp_path, capfd
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
    runner.run(str(tmp_path), wire=SeamDriver(make_plan(data_dir)))
    seen = reports(capfd.readouterr().err)
    assert len(seen) == 6  # one process per fold
    development = random.Random(208)
    imported, constructed = development.random(), development.random()
    for _, import_draw, init_draw, _, cwd, module_dir, files in seen:
        assert (import_draw, init_draw) == (imported, constructed)  # seeded before the import, every fold
        assert cwd == module_dir != str(tmp_path) and files == ["agent.py"]
    assert len({cwd for *_, cwd, _, _ in seen}) == 6 and not any(os.path.exists(s[4]) for s in seen)

    runner.run(str(tmp_path), wire=SeamDriver(make_plan(data_dir, phase="final")))
    seen = reports(capfd.readouterr().err)
    assert len(seen) == 18
    for run in range(3):
        expected = (random.Random(run + 1).random(), float(np.random.RandomState(run + 1).random_sample()))
        assert all((s[2], s[3]) == expected for s in seen[run * 6 : run * 6 + 6])  # seeded after the import


def test_an_action_the_evaluator_refuses_stops_the_runner(data_dir, untouched_process, tmp_path):
    write_agent(
        tmp_path,
        """
        class Agent(OneStep):
            def suggest(self, observation):
                return (None, "no such algorithm", 1.0)
        """,
    )
    with pytest.raises(Exception, match="'no such algorithm' names no algorithm"):
        runner.run(str(tmp_path), wire=SeamDriver(make_plan(data_dir)))


def test_meta_train_gets_the_challenges_arguments(data_dir, meta, untouched_process, tmp_path, capfd):
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
    runner.run(str(tmp_path), wire=SeamDriver(make_plan(data_dir)))
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

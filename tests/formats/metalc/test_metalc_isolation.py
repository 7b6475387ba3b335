"""A MetaLC agent must not remember earlier folds. Each fold meta-trains on the other folds' curves,
test curves included, and those other folds hold the datasets later folds are scored on: an agent
that keeps them plays those folds knowing the very curves it is scored on.

The hostile agent below keeps every curve it is handed in six places (a module global, a class
attribute, and files in its working folder, next to its own module, in the temporary folder and
in the home folder); on a dataset it has curves for, it explores and credits the best algorithm
at once, else it plays exactly like examples/metalc_agent/agent.py. In one process, as the
challenge ran it, it beats that agent; through ``arbiter.client.metalc`` every fold must start
with all six caches empty, so it scores exactly what the honest agent scores.

Then the fold's process itself: an error of the agent stops the runner saying what and where,
what a fold's agent started ends with its fold, a stopped runner leaves no fold running, and an
evaluator restarted mid-fold has the fold played again by a fresh agent.
"""

from __future__ import annotations

import hashlib
import importlib.util
import json
import os
import random
import shutil
import signal
import subprocess
import sys
import tempfile
import textwrap
import time
from pathlib import Path
from typing import Any

import numpy as np
import paths
import pytest
from harness import finish, read_episodes, read_summary, running_service, wait_for
from processes import alive

from arbiter.client import metalc as runner
from arbiter.client.wire import Wire
from arbiter.protocol.errors import ArbiterError
from arbiter.server.core.competition import load_competition
from arbiter.server.formats.metalc.data import load_meta_dataset
from arbiter.server.formats.metalc.env import folds
from arbiter.server.formats.metalc.generate import GeneratorSettings, write_meta_dataset
from arbiter.server.formats.metalc.local import play_phase
from arbiter.server.formats.metalc.scoring import phase_score

REPO = paths.REPO
HONEST = REPO / "examples" / "metalc_agent" / "agent.py"
SETTINGS = GeneratorSettings(datasets=12, algorithms=5, seed=3)
FAST = ["budgets.idle_s=10", "budgets.overall_s=300"]
REPORT_PREFIX = "hostile-fold "

HOSTILE = '''
import json
import os
import sys
import tempfile

from honest import Agent as Honest

CACHE_FILE = "metalc-curves-cache.json"
REPORT_PREFIX = "@REPORT_PREFIX@"
REMEMBERED = {}  # dataset key -> {"valid": {algorithm: [times, scores]}, "test": {...}}


def dataset_key(meta_features):
    return json.dumps(sorted(meta_features.items()))


def cache_paths():
    return {
        "cwd": os.path.join(os.getcwd(), CACHE_FILE),
        "module_dir": os.path.join(os.path.dirname(os.path.abspath(__file__)), CACHE_FILE),
        "tmp": os.path.join(tempfile.gettempdir(), CACHE_FILE),
        "home": os.path.join(os.path.expanduser("~"), CACHE_FILE),
    }


def read_file_cache(path):
    try:
        with open(path, encoding="utf-8") as handle:
            return json.load(handle)
    except (OSError, ValueError):
        return {}


class Agent(Honest):
    remembered = {}  # a class attribute: lives as long as the class does

    def __init__(self, number_of_algorithms):
        super().__init__(number_of_algorithms)
        found = {"global": len(REMEMBERED), "class": len(Agent.remembered)}
        for where, path in cache_paths().items():
            cached = read_file_cache(path)
            found[where] = len(cached)
            REMEMBERED.update(cached)
        REMEMBERED.update(Agent.remembered)
        places = {"cwd": os.getcwd(), "tmp": tempfile.gettempdir(), "home": os.path.expanduser("~")}
        print(REPORT_PREFIX + json.dumps({"found": found, "places": places}), file=sys.stderr, flush=True)

    def meta_train(self, dataset_meta_features, algorithms_meta_features, validation, test):
        super().meta_train(dataset_meta_features, algorithms_meta_features, validation, test)
        for name, meta_features in dataset_meta_features.items():
            REMEMBERED[dataset_key(meta_features)] = {
                split: {a: [[float(t) for t in c.timestamps], [float(s) for s in c.scores]] for a, c in row.items()}
                for split, row in (("valid", validation[name]), ("test", test[name]))
            }
        Agent.remembered = dict(REMEMBERED)
        for path in cache_paths().values():
            try:
                with open(path, "w", encoding="utf-8") as handle:
                    json.dump(REMEMBERED, handle)
            except OSError:
                pass

    def reset(self, dataset_meta_features, algorithms_meta_features):
        super().reset(dataset_meta_features, algorithms_meta_features)
        self.known = REMEMBERED.get(dataset_key(dataset_meta_features))
        self.plan = self.plan_from(self.known) if self.known else []

    def plan_from(self, known):
        """Reach the point of the best early test score, credit it at once; then the algorithm with
        the best final test score, credited at once; then spend what remains."""
        valid, test = known["valid"], known["test"]

        def first_point(a):
            return test[a][1][0], -valid[a][0][0]

        early = max(valid, key=first_point)
        late = max(valid, key=lambda a: test[a][1][-1])
        return [
            (None, early, valid[early][0][0]),
            (early, early, 0.0),
            (early, late, valid[late][0][-1]),
            (late, late, 0.0),
            (late, late, float("inf")),
        ]

    def suggest(self, observation):
        if self.plan:
            return self.plan.pop(0)
        return super().suggest(observation)
'''


def submission_with_hostile_agent(folder: Path) -> Path:
    folder.mkdir()
    (folder / "honest.py").write_text(HONEST.read_text(encoding="utf-8"), encoding="utf-8")
    (folder / "agent.py").write_text(HOSTILE.replace("@REPORT_PREFIX@", REPORT_PREFIX), encoding="utf-8")
    return folder


def load_class(path: Path, name: str) -> type:
    folder = str(path.parent)
    sys.path.insert(0, folder)
    try:
        spec = importlib.util.spec_from_file_location(name, path)
        module = importlib.util.module_from_spec(spec)
        spec.loader.exec_module(module)
    finally:
        sys.path.remove(folder)
        sys.modules.pop("honest", None)
    return module.Agent


def folder_digest(folder: Path) -> dict[str, str]:
    return {
        str(path.relative_to(folder)): hashlib.sha256(path.read_bytes()).hexdigest()
        for path in sorted(folder.rglob("*"))
        if path.is_file()
    }


def figures(records: list[dict[str, Any]]) -> list[tuple[Any, ...]]:
    return [(r["run"], r["fold"], r["dataset"], r["alc"], r["final_score"], r["times"], r["scores"]) for r in records]


def fold_reports(stderr: str) -> list[dict[str, Any]]:
    return [json.loads(line[len(REPORT_PREFIX) :]) for line in stderr.splitlines() if line.startswith(REPORT_PREFIX)]


@pytest.fixture(scope="module")
def data_dir(tmp_path_factory):
    folder = tmp_path_factory.mktemp("metalc-isolation") / "data"
    write_meta_dataset(str(folder), SETTINGS)
    return str(folder)


@pytest.fixture
def sandboxed_process(tmp_path, monkeypatch):
    """For agents played in this process: their own working, home and temporary folders, and the
    global random generators as they were."""
    for name in ("cwd", "home", "tmp"):
        (tmp_path / name).mkdir()
    monkeypatch.chdir(tmp_path / "cwd")
    monkeypatch.setenv("HOME", str(tmp_path / "home"))
    monkeypatch.setattr(tempfile, "tempdir", str(tmp_path / "tmp"))
    python_state, numpy_state = random.getstate(), np.random.get_state()
    yield
    random.setstate(python_state)
    np.random.set_state(numpy_state)


def test_in_one_process_the_hostile_agent_beats_the_honest_one(data_dir, tmp_path, sandboxed_process, capfd):
    meta = load_meta_dataset(data_dir)
    hostile = phase_score(play_phase(meta, load_class(submission_with_hostile_agent(tmp_path / "s") / "agent.py",
                                                      "hostile_in_process"), "final"), "final")  # fmt: skip
    honest = phase_score(play_phase(meta, load_class(HONEST, "honest_in_process"), "final"), "final")
    assert hostile.average_alc >= honest.average_alc + 0.1, (hostile, honest)
    reports = fold_reports(capfd.readouterr().err)
    assert len(reports) == 18 and sum(reports[-1]["found"].values()) > 0  # it did remember


def test_through_the_runner_every_fold_starts_with_empty_caches_and_scores_honestly(
    data_dir, redis_url, service_id, tmp_path, sandboxed_process
):
    submission = submission_with_hostile_agent(tmp_path / "submission")
    before = folder_digest(submission)
    competition = load_competition("metalc-wcci2022", ["phase=final", *FAST])
    results = str(tmp_path / "r")
    with running_service(competition, tests=data_dir, results=results, redis_url=redis_url, service_id=service_id) as (
        _,
        outcome,
    ):
        env = {**os.environ, "ARBITER_REDIS_URL": redis_url, "AICROWD_SUBMISSION_ID": service_id}
        played = subprocess.run([sys.executable, "-m", "arbiter.client.metalc", str(submission)],
                                env=env, capture_output=True, text=True, timeout=100)  # fmt: skip
        summary = finish(outcome, timeout_s=30)
    assert played.returncode == 0, played.stderr[-3000:]
    assert summary["state"] == "SUCCESS"

    reports = fold_reports(played.stderr)
    assert len(reports) == 18  # 3 runs of 6 folds, a fresh agent each
    assert all(set(r["found"].values()) == {0} for r in reports), reports
    for place in ("cwd", "tmp", "home"):
        paths = [r["places"][place] for r in reports]
        assert len(set(paths)) == 18, f"two folds shared a {place} folder"
        assert not any(os.path.exists(p) for p in paths), f"a fold's {place} folder outlived its fold"
    assert folder_digest(submission) == before  # the submission folder itself is untouched

    honest = play_phase(load_meta_dataset(data_dir), load_class(HONEST, "honest_reference"), "final")
    assert figures(read_episodes(results)) == figures(honest)


# -- the fold's process: its errors, what it leaves behind, an evaluator's restart -----------------

ONE_STEP = """
import os
import subprocess
import sys


class Agent:
    def __init__(self, number_of_algorithms):
        pass

    def meta_train(self, dataset_meta_features, algorithms_meta_features, validation, test):
        pass

    def reset(self, dataset_meta_features, algorithms_meta_features):
        self.budget = float(dataset_meta_features["time_budget"])

    def suggest(self, observation):
        return (None, 0, self.budget)
"""


def play_through_the_runner(source: str, data_dir: str, redis_url: str, service_id: str, tmp_path: Path) -> Any:
    """The runner in this process (its folds' processes its own), against a real evaluator."""
    submission = tmp_path / "submission"
    submission.mkdir(exist_ok=True)
    (submission / "agent.py").write_text(ONE_STEP + textwrap.dedent(source), encoding="utf-8")
    competition = load_competition("metalc-wcci2022", FAST)
    with running_service(competition, tests=data_dir, results=str(tmp_path / "r"), redis_url=redis_url,
                         service_id=service_id):  # fmt: skip
        wire = Wire(redis_url, service_id, reply_timeout_s=20)
        try:
            return runner.run(str(submission), wire=wire)
        finally:
            wire.close()


@pytest.mark.parametrize(
    "source,message",
    [("""
      class Agent(Agent):
          def meta_train(self, *args):
              raise ValueError("no luck")
      """, r"run 0, fold 0: the agent failed: ValueError in Agent\(\) or meta_train\(\): no luck"),
     ("""
      class Agent(Agent):
          def suggest(self, observation):
              os._exit(3)
      """, r"run 0, fold 0: the agent's process ended without answering \(exit status 3\)"),
     ("""
      class Agent(Agent):
          def suggest(self, observation):
              return "0"
      """, r"ArbiterError in reset\(\) or the first suggest\(\): the agent's suggest\(\) returned '0'; an action"),
     ("""
      Agent = None
      del Agent
      """, r"ArbiterError while importing the agent: agent.py defines no class Agent")],
)  # fmt: skip
def test_an_error_of_the_agent_stops_the_runner_saying_what_and_where(
    data_dir, redis_url, service_id, tmp_path, source, message
):
    with pytest.raises(ArbiterError, match=message):
        play_through_the_runner(source, data_dir, redis_url, service_id, tmp_path)


def test_a_submission_folder_without_its_module_is_refused_before_connecting(tmp_path):
    with pytest.raises(ArbiterError, match="no agent.py in"):
        runner.run(str(tmp_path), wire=object())  # never used: the folder is checked first


def test_what_a_folds_agent_started_ends_with_its_fold(data_dir, redis_url, service_id, tmp_path, capfd):
    source = f"""
        class Agent(Agent):
            def meta_train(self, *args):
                helper = subprocess.Popen([sys.executable, "-c", "import time; time.sleep(60)"])
                print({REPORT_PREFIX!r} + str(helper.pid), file=sys.stderr, flush=True)
        """
    play_through_the_runner(source, data_dir, redis_url, service_id, tmp_path)
    helpers = [int(line[len(REPORT_PREFIX) :]) for line in capfd.readouterr().err.splitlines()
               if line.startswith(REPORT_PREFIX)]  # fmt: skip
    assert len(helpers) == 6
    for pid in helpers:  # gone, or a zombie its new parent has yet to reap
        assert not alive(pid), pid


@pytest.mark.parametrize("stop", [signal.SIGTERM, signal.SIGINT, signal.SIGKILL])
def test_a_stopped_runner_leaves_no_fold_running(data_dir, redis_url, service_id, tmp_path, stop):
    """Stopped (``arbiter run`` stops its agent with SIGTERM, Ctrl-C with SIGINT), the runner kills
    its busy fold at once and removes its folders, within the time ``arbiter run`` gives a stopped
    agent before it kills it (which would leave the folders behind)."""
    from arbiter.server.cli.runner import AGENT_INTERRUPT_GRACE_S

    submission = tmp_path / "submission"
    submission.mkdir()
    (submission / "agent.py").write_text(ONE_STEP + textwrap.dedent(f"""
        class Agent(Agent):
            def meta_train(self, *args):
                print({REPORT_PREFIX!r} + str(os.getpid()) + " " + os.getcwd(), file=sys.stderr, flush=True)
                while True:  # meta-trains for ever
                    pass
        """), encoding="utf-8")  # fmt: skip
    competition = load_competition("metalc-wcci2022", FAST)
    env = {**os.environ, "ARBITER_REDIS_URL": redis_url, "AICROWD_SUBMISSION_ID": service_id}
    with running_service(competition, tests=data_dir, results=str(tmp_path / "r"), redis_url=redis_url,
                         service_id=service_id):  # fmt: skip
        player = subprocess.Popen([sys.executable, "-m", "arbiter.client.metalc", str(submission)], env=env,
                                  stdout=subprocess.DEVNULL, stderr=subprocess.PIPE, text=True)  # fmt: skip
        try:
            said = ""
            while not (line := player.stderr.readline()).startswith(REPORT_PREFIX):
                said += line
                assert line, said[-3000:]  # the runner ended before the fold's agent said its pid
            pid, workdir = line[len(REPORT_PREFIX) :].split()
            fold = int(pid)
            assert alive(fold)
            player.send_signal(stop)
            stopped_at = time.monotonic()
            player.wait(timeout=10)
            exited_after_s = time.monotonic() - stopped_at
            wait_for(lambda: not alive(fold), timeout_s=10, what="the fold's process to end")
        finally:
            if player.poll() is None:
                player.kill()
                player.wait()
    fold_folder = os.path.dirname(workdir)
    if stop != signal.SIGKILL:  # it unwound, ending its fold on the way
        assert player.returncode == 128 + stop and not os.path.exists(fold_folder)
        assert exited_after_s < AGENT_INTERRUPT_GRACE_S
    else:  # nothing of the runner's ran: the fold's folder stays, as the README says
        assert os.path.basename(fold_folder).startswith("arbiter-metalc-fold-")
        shutil.rmtree(fold_folder)


GATED = """
import json
import os
import sys
import time

from honest import Agent as Honest

CONTROL = os.environ["METALC_TEST_CONTROL"]


class Agent(Honest):
    def __init__(self, number_of_algorithms):
        super().__init__(number_of_algorithms)
        print("@REPORT_PREFIX@" + json.dumps({"pid": os.getpid()}), file=sys.stderr, flush=True)

    def reset(self, dataset_meta_features, algorithms_meta_features):
        super().reset(dataset_meta_features, algorithms_meta_features)
        go = os.path.join(CONTROL, "go")
        if dataset_meta_features["name"] == "@GATED_DATASET@" and not os.path.exists(go):
            open(os.path.join(CONTROL, "paused"), "w").close()
            while not os.path.exists(go):  # the test's signal: a file
                time.sleep(0.002)
"""


def serve(data_dir: str, redis_url: str, service_id: str, results: str, log: Path, *extra: str) -> subprocess.Popen:
    with open(log, "a", encoding="utf-8") as out:  # a file, not a pipe: nothing waits for a reader
        return subprocess.Popen(
            [sys.executable, "-m", "arbiter.server.cli", "serve", "--competition", "metalc-wcci2022", "--tests",
             data_dir, "--redis-url", redis_url, "--service-id", service_id, "--results", results, "--quiet", *extra],
            cwd=str(REPO), stdout=subprocess.DEVNULL, stderr=out,
        )  # fmt: skip


def test_an_evaluator_restarted_mid_fold_has_the_fold_played_again_by_a_fresh_agent(
    data_dir, redis_url, service_id, tmp_path, sandboxed_process
):
    meta = load_meta_dataset(data_dir)
    gated_dataset = folds(meta.datasets)[0].meta_test[1]  # the first fold's second dataset
    submission = tmp_path / "submission"
    submission.mkdir()
    (submission / "honest.py").write_text(HONEST.read_text(encoding="utf-8"), encoding="utf-8")
    agent_source = GATED.replace("@REPORT_PREFIX@", REPORT_PREFIX).replace("@GATED_DATASET@", gated_dataset)
    (submission / "agent.py").write_text(agent_source, encoding="utf-8")
    control = tmp_path / "control"
    control.mkdir()
    results = str(tmp_path / "r")
    env = {**os.environ, "ARBITER_REDIS_URL": redis_url, "AICROWD_SUBMISSION_ID": service_id,
           "METALC_TEST_CONTROL": str(control)}  # fmt: skip
    evaluator_log, runner_log = tmp_path / "evaluator.log", tmp_path / "runner.log"
    evaluator = serve(data_dir, redis_url, service_id, results, evaluator_log)
    with open(runner_log, "w", encoding="utf-8") as out:
        player = subprocess.Popen([sys.executable, "-m", "arbiter.client.metalc", str(submission)], env=env,
                                  stdout=subprocess.DEVNULL, stderr=out)  # fmt: skip
    restarted = None
    try:
        wait_for(lambda: (control / "paused").exists() or player.poll() is not None, timeout_s=60, what="the pause")
        assert player.poll() is None, runner_log.read_text()[-3000:]
        evaluator.kill()  # mid-fold: the fold's first dataset is recorded, its second under way
        evaluator.wait()
        restarted = serve(data_dir, redis_url, service_id, results, evaluator_log, "--resume")
        (control / "go").touch()
        assert player.wait(timeout=90) == 0, runner_log.read_text()[-3000:]
        assert restarted.wait(timeout=30) == 0, evaluator_log.read_text()[-3000:]
        said = runner_log.read_text()
    finally:
        for process in (evaluator, restarted, player):
            if process is not None and process.poll() is None:
                process.kill()
                process.wait()

    assert "the evaluator was restarted" in said
    pids = [report["pid"] for report in fold_reports(said)]
    assert len(pids) == 7 and len(set(pids)) == 7  # the first fold twice, each time a fresh process
    summary = read_summary(results)
    assert summary["state"] == "SUCCESS" and summary["replayed"]
    honest = play_phase(meta, load_class(HONEST, "honest_restart_reference"), "dev", seeding="fold")
    assert figures(read_episodes(results)) == figures(honest)


def test_the_folders_of_a_runner_killed_outright_are_removed_by_the_next_one(tmp_path, monkeypatch):
    """A runner killed with SIGKILL cannot remove its fold's folder (its fold process dies with
    it): the next runner removes the folders of runners that no longer run, and only those."""
    import subprocess
    import sys
    import tempfile

    from arbiter.client import metalc_process as metalc

    monkeypatch.setattr(tempfile, "tempdir", str(tmp_path))
    ended = subprocess.run([sys.executable, "-c", "import os; print(os.getpid())"], capture_output=True, text=True)
    dead_pid = int(ended.stdout)
    abandoned = tmp_path / f"{metalc.FOLD_FOLDER_PREFIX}{dead_pid}-abc"
    (abandoned / "submission").mkdir(parents=True)
    running = tmp_path / f"{metalc.FOLD_FOLDER_PREFIX}{os.getpid()}-def"
    running.mkdir()
    other = tmp_path / "arbiter-metalc-fold-notapid"
    other.mkdir()
    metalc.remove_abandoned_folds()
    assert not abandoned.exists()
    assert running.exists() and other.exists()


def test_a_runner_whose_evaluation_ends_by_itself_scored_exits_0(data_dir, tmp_path):
    """The agent's suggestions all come too late: the evaluation ends by itself after its
    successive timeouts, scored (SUCCESS). The runner is told so (EvaluationError, ``ended``
    SUCCESS) and exits 0, so `arbiter run` says SUCCESS with status 0, not the runner's failure."""
    submission = tmp_path / "submission"
    submission.mkdir()
    (submission / "agent.py").write_text(ONE_STEP + textwrap.dedent("""
        import time

        class Agent(Agent):
            def suggest(self, observation):
                time.sleep(0.3)  # past every step budget
                return super().suggest(observation)
        """), encoding="utf-8")  # fmt: skip
    settings = [*FAST, "budgets.step_s=0.1", "budgets.planning_s=0.1", "budgets.max_successive_timeouts=2"]
    results = tmp_path / "r"
    done = subprocess.run(
        [sys.executable, "-m", "arbiter.server.cli", "run", "--competition", "metalc-wcci2022", "--tests", data_dir,
         *[f"--set={setting}" for setting in settings], "--results", str(results), "--quiet", "--",
         sys.executable, "-m", "arbiter.client.metalc", str(submission)],
        capture_output=True, text=True, timeout=120,
    )  # fmt: skip
    summary = read_summary(str(results))
    assert summary["state"] == "SUCCESS" and "successive timeouts" in summary["termination_cause"]
    assert done.returncode == 0, done.stderr[-2000:]
    assert "the evaluation has ended (SUCCESS)" in done.stderr

"""What one evaluation on Kubernetes runs, worked out from the competition as the submission asked
for it and the worker's options: the plan kubernetes_manifests.py builds the objects from.

The evaluator in the pod is given the same competition as the worker's own spec (a preset by
name, an organiser's file by its text, mounted from the Secret), with the submission's
``--set``, ``--phase`` and ``--debug``, so both sides agree on the budgets, the deadline and the
results folder. The agent runs the submission's image (else the competition's ``[hosting]
image``); an agent command given with the submission replaces the image's CMD, as ``docker run
IMAGE COMMAND`` does. A submission's working folder is not used: the agent's files are its image's.
"""

from __future__ import annotations

import json
import os

from arbiter.protocol.errors import ConfigError
from arbiter.server.core.competition import CompetitionSpec, preset_names
from arbiter.server.core.rescore import EPISODES_FILE, EVENTS_FILE, SUMMARY_FILE
from arbiter.server.formats import get_format
from arbiter.server.hosting.kubernetes_manifests import (
    COMPETITION_MOUNT,
    RESULTS_MOUNT,
    TESTS_MOUNT,
    EvaluationPlan,
    KubernetesOptions,
    evaluation_name,
)
from arbiter.server.hosting.queue import job_timeout_s
from arbiter.server.hosting.submissions import Submission
from arbiter.server.service.events import first_start_recorded
from arbiter.server.service.records_file import read_items


def evaluator_args(
    competition: str, submission: Submission, *, tests: str | None, results: str, resume: bool, agent: bool = True
) -> tuple[str, ...]:
    """``arbiter serve``'s options (the image's entrypoint) for the competition as the submission
    asked for it: the same overrides, phase and debug as the worker's own spec. ``agent`` False:
    the pod runs no agent (``--no-agent``, a resume with nothing left to play)."""
    args = ["--competition", competition]
    for assignment in submission.sets:
        args += ["--set", assignment]
    if submission.phase is not None:
        args += ["--phase", str(submission.phase)]
    if submission.debug:
        args.append("--debug")
    if tests is not None:
        args += ["--tests", tests]
    # The pod's Redis is the evaluation's own (a sidecar): full, it was filled by the agent.
    args += ["--results", results, "--service-id", submission.id, "--private-redis"]
    return tuple(args + (["--resume"] if resume else []) + ([] if agent else ["--no-agent"]))


def nothing_left_to_play(results_dir: str) -> bool:
    """Whether the evaluation in ``results_dir`` holds a record of every item and has not ended
    (an evaluator killed after its last item and before its summary): its resume then runs no
    agent, which would only be told there is nothing to play (DIAMBRA's loop steps on after its
    first reset, and fails). Read from its files alone: the worker need not see the test data."""
    try:
        with open(os.path.join(results_dir, SUMMARY_FILE), encoding="utf-8") as handle:
            summary = json.load(handle)
    except (OSError, ValueError):
        summary = None  # none yet, or cut by the kill: the records say how far it went
    if isinstance(summary, dict) and summary.get("state") in ("SUCCESS", "FAILED"):
        return False  # ended: the evaluator says so, and there is nothing to resume
    started = first_start_recorded(os.path.join(results_dir, EVENTS_FILE))
    total = started.get("episodes_total") if started is not None else None
    if type(total) is not int or total < 1:
        return False
    items = read_items(os.path.join(results_dir, EPISODES_FILE)).items
    return len({item.index for item in items}) >= total


def plan_evaluation(
    spec: CompetitionSpec, submission: Submission, options: KubernetesOptions, *, resume: bool, agent: bool = True
) -> EvaluationPlan:
    """``agent`` False (a resume with nothing left to play): the Job runs the evaluator alone."""
    image = getattr(submission, "image", None) or spec.hosting.image
    if not image:
        raise ConfigError(
            f"submission {submission.id} names no agent image, and competition {spec.name!r} has no "
            "[hosting] image: the kubernetes backend runs agents from images"
        )
    competition_file = None
    if os.path.isfile(submission.competition):
        file_name = os.path.basename(submission.competition)
        with open(submission.competition, encoding="utf-8") as handle:
            competition_file = (file_name, handle.read())
        competition = f"{COMPETITION_MOUNT}/{file_name}"
    elif submission.competition in preset_names():
        competition = submission.competition
    else:
        raise ConfigError(f"competition {submission.competition!r} is neither a file on this worker nor a preset")
    tests = spec.tests or (TESTS_MOUNT if get_format(spec.format).requires_tests else None)
    if tests is not None:
        if options.tests_claim is None:
            raise ConfigError(
                f"competition {spec.name!r} evaluates on test data: give the worker --kube-tests-claim, "
                f"the claim that holds it (mounted at {TESTS_MOUNT})"
            )
        if tests != TESTS_MOUNT and not tests.startswith(TESTS_MOUNT + "/"):
            raise ConfigError(
                f"competition {spec.name!r} reads its tests from {tests!r}; with the kubernetes backend the tests "
                f"claim is mounted at {TESTS_MOUNT}: name a folder under it"
            )
    competition_name = submission.competition_name or spec.name
    results = f"{RESULTS_MOUNT}/{competition_name}/{submission.id}"
    return EvaluationPlan(
        name=evaluation_name(submission.id),
        submission_id=submission.id,
        competition_name=competition_name,
        agent_image=image,
        agent_args=tuple(submission.agent),
        evaluator_args=evaluator_args(
            competition, submission, tests=tests, results=results, resume=resume, agent=agent
        ),
        competition_file=competition_file,
        tests=tests,
        deadline_s=job_timeout_s(spec),
        hosting=spec.hosting,
        agent=agent,
    )


# docker/k8s-job.yaml's placeholders (scripts/k8s_job_example.py), filled in by envsubst.
EXAMPLE_PLACEHOLDERS = {
    "AICROWD_SUBMISSION_ID": "the evaluation's service id (its Redis keys, its ACL user)",
    "EVALUATION": "a name for its Kubernetes objects (lowercase, digits, -), e.g. arbiter-sub-0042",
    "EVALUATOR_IMAGE": "the image of docker/evaluator.Dockerfile",
    "AGENT_IMAGE": "the participant's image (built on docker/agent-base.Dockerfile)",
    "ARBITER_TESTS_CLAIM": "a PersistentVolumeClaim holding the hidden test set",
    "ARBITER_RESULTS_CLAIM": "a PersistentVolumeClaim for results; each evaluation writes its own folder",
}


def example_plan(spec: CompetitionSpec) -> tuple[EvaluationPlan, KubernetesOptions]:
    """One evaluation of the preset ``spec`` with ``${...}`` placeholders for what a worker fills in."""
    submission = Submission(id="${AICROWD_SUBMISSION_ID}", competition=spec.name, participant="", agent=[])
    tests = TESTS_MOUNT if get_format(spec.format).requires_tests else None
    results = f"{RESULTS_MOUNT}/{spec.name}/{submission.id}"
    plan = EvaluationPlan(
        name="${EVALUATION}",
        submission_id=submission.id,
        competition_name=spec.name,
        agent_image="${AGENT_IMAGE}",
        agent_args=(),
        evaluator_args=evaluator_args(spec.name, submission, tests=tests, results=results, resume=False),
        competition_file=None,
        tests=tests,
        deadline_s=job_timeout_s(spec),
        hosting=spec.hosting,
    )
    options = KubernetesOptions(
        evaluator_image="${EVALUATOR_IMAGE}",
        results_claim="${ARBITER_RESULTS_CLAIM}",
        tests_claim="${ARBITER_TESTS_CLAIM}",
    )
    return plan, options

"""agent.log on Kubernetes (server/hosting/kubernetes_agent_log.py): the log of the evaluation
pod's ``agent`` container, kept in the results folder before the Job goes.

How the backend keeps it as it follows, stops and replaces Jobs runs against
test_kubernetes_backend.py's ``ScriptedCluster``. How the log is read from the API runs the real
client and ``Cluster`` over HTTP, against a loopback stand-in for the API server that answers
the pod list, the pod's log (an outage, a container that never started, a previous instance, a
response cut off) and the Job's annotation. The live test of test_kubernetes_backend.py reads a
log on a real cluster.
"""

from __future__ import annotations

import json
import re
import threading
from collections.abc import Iterator
from http.server import BaseHTTPRequestHandler, ThreadingHTTPServer
from pathlib import Path
from urllib.parse import parse_qs, urlparse

import pytest
from kubernetes.client import ApiClient, Configuration, V1ContainerState, V1ContainerStateTerminated, V1Job
from kubernetes_objects import OPTIONS, STARTED, a_job, a_pod, a_submission, plan_for
from test_kubernetes_backend import Moment, ScriptedCluster, evaluate

from arbiter.server.hosting import kubernetes_cluster
from arbiter.server.hosting.agent_log import AGENT_LOG_CAP_BYTES, AGENT_LOG_TAIL_BYTES, READ_BYTES
from arbiter.server.hosting.kubernetes_agent_log import ATTEMPT_ANNOTATION, KEPT_ANNOTATION, keep_agent_log
from arbiter.server.hosting.kubernetes_backend import start_evaluation
from arbiter.server.hosting.kubernetes_cluster import Cluster
from arbiter.server.hosting.kubernetes_status import EvaluationLost
from arbiter.server.service import results_fence

HEADER = re.compile(rb"^=== arbiter: attempt (\d+), agent started (\S+) ===\n", re.MULTILINE)
PRINTED = b'{"step": 1, "reward": 0.5}\nTraceback (most recent call last):\nValueError: \xff bad\n'


def parts(results_dir: Path) -> list[tuple[int, bytes]]:
    """agent.log's parts: (attempt, what the part holds)."""
    text = (results_dir / "agent.log").read_bytes()
    headers = list(HEADER.finditer(text))
    assert headers and headers[0].start() == 0, text[:200]
    ends = [one.start() for one in headers[1:]] + [len(text)]
    for found in headers:
        assert found.group(2) == b"2030-01-01T00:00:01.000+00:00"  # the agent container's start
    return [(int(found.group(1)), text[found.end() : end]) for found, end in zip(headers, ends, strict=True)]


# -- as the backend follows, stops and replaces Jobs ----------------------------------------------


def test_a_job_that_ended_leaves_its_agents_output_byte_for_byte_and_is_marked(tmp_path: Path) -> None:
    submission = a_submission()
    submission.attempts = 3
    plan, results_dir = plan_for(submission, tmp_path)
    cluster = ScriptedCluster(results_dir, [Moment(), Moment("failed", 0, 2, summary="FAILED")])
    cluster.agent_output = PRINTED  # JSON the client's own decoding would have rewritten, bytes not UTF-8
    evaluated = evaluate(cluster, submission, results_dir)
    assert evaluated.agent_status == 2
    assert parts(results_dir) == [(3, PRINTED)]
    annotations = cluster.jobs[plan.name].metadata.annotations  # the Job stays: the next attempt skips it
    assert annotations[ATTEMPT_ANNOTATION] == "3" and annotations[KEPT_ANNOTATION] == "kept"


def test_an_agent_outstaying_the_evaluator_leaves_its_log_before_the_job_is_deleted(tmp_path: Path) -> None:
    submission = a_submission()
    submission.attempts = 1
    _, results_dir = plan_for(submission, tmp_path)
    cluster = ScriptedCluster(results_dir, [Moment(), Moment(evaluator=0, summary="SUCCESS")])
    cluster.agent_output = b"still thinking\n"
    evaluate(cluster, submission, results_dir)
    assert ("delete",) in cluster.calls and not cluster.jobs  # the log was read while the pod was there
    assert parts(results_dir) == [(1, b"still thinking\n")]


def test_a_job_replaced_after_its_worker_was_lost_leaves_its_part_then_the_new_one_its_own(tmp_path: Path) -> None:
    submission = a_submission()
    plan, results_dir = plan_for(submission, tmp_path)
    cluster = ScriptedCluster(results_dir, [Moment("failed", 137, 1, reason="DeadlineExceeded")])
    start_evaluation(cluster, plan, OPTIONS, attempt=1)  # its worker was lost: nobody followed the Job
    cluster.agent_output = b"first agent\n"
    cluster.read_job(plan.name)  # it ran out of time without a worker
    cluster.script, cluster.looks = [Moment("complete", 0, 0, summary="SUCCESS")], 0
    submission.attempts = 2
    replaced = cluster.delete_job

    def delete_job(name: str) -> None:  # the new Job's agent prints something else
        replaced(name)
        cluster.agent_output = b"second agent\n"

    cluster.delete_job = delete_job
    evaluate(cluster, submission, results_dir, resume=True)
    assert parts(results_dir) == [(1, b"first agent\n"), (2, b"second agent\n")]


def test_a_part_is_written_once_by_the_attempt_that_collected_it(tmp_path: Path) -> None:
    submission = a_submission()
    submission.attempts = 1
    _, results_dir = plan_for(submission, tmp_path)
    cluster = ScriptedCluster(results_dir, [Moment("failed", 1, 1, reason="BackoffLimitExceeded")])
    cluster.agent_output = b"crashed\n"
    with pytest.raises(EvaluationLost):
        evaluate(cluster, submission, results_dir)
    submission.attempts = 2  # the retry replaces the Job, whose part is written already
    cluster.script, cluster.looks = [Moment("complete", 0, 0, summary="SUCCESS")], 0
    cluster.agent_output = b"fine\n"  # read again from the first Job, it would make a second part 1
    evaluate(cluster, submission, results_dir, resume=True)
    assert parts(results_dir) == [(1, b"crashed\n"), (2, b"fine\n")]


def test_an_agent_whose_image_was_never_pulled_leaves_no_part(tmp_path: Path) -> None:
    submission = a_submission()
    _, results_dir = plan_for(submission, tmp_path)
    script = [Moment("failed", "waiting:PodInitializing", "waiting:ImagePullBackOff", reason="DeadlineExceeded")]
    cluster = ScriptedCluster(results_dir, script)
    with pytest.raises(EvaluationLost):
        evaluate(cluster, submission, results_dir)
    assert not (results_dir / "agent.log").exists() and cluster.log_reads == []


def test_a_log_past_the_cap_keeps_its_head_and_its_tail_and_counts_what_it_dropped(tmp_path: Path) -> None:
    submission = a_submission()
    submission.attempts = 1
    _, results_dir = plan_for(submission, tmp_path)
    cluster = ScriptedCluster(results_dir, [Moment("complete", 0, 0, summary="SUCCESS")])
    printed = b"".join(b"line %07d\n" % index for index in range(600_000))  # 7.2 MB
    cluster.agent_output = printed
    evaluate(cluster, submission, results_dir)
    ((attempt, kept),) = parts(results_dir)
    head = AGENT_LOG_CAP_BYTES - AGENT_LOG_TAIL_BYTES
    dropped = len(printed) - AGENT_LOG_CAP_BYTES
    cut = b"\n" if printed[head - 1 : head] != b"\n" else b""
    assert (
        kept
        == printed[:head]
        + cut
        + b"=== arbiter: output cut here, %d bytes dropped ===\n" % dropped
        + (printed[-AGENT_LOG_TAIL_BYTES:])
    )


def test_an_attempt_that_lost_its_lock_writes_no_part(tmp_path: Path) -> None:
    submission = a_submission()
    plan, results_dir = plan_for(submission, tmp_path)
    cluster = ScriptedCluster(results_dir, [Moment("failed", 0, 2)])
    job = start_evaluation(cluster, plan, OPTIONS, attempt=1)
    cluster.read_job(plan.name)
    cluster.agent_output = b"printed\n"
    results_dir.mkdir(parents=True)
    with results_fence.fenced(lambda: "its lock lapsed"):
        assert not keep_agent_log(cluster, job, str(results_dir), attempt=1, leaves_job=True)
    assert not (results_dir / "agent.log").exists() and cluster.log_reads == []
    assert KEPT_ANNOTATION not in job.metadata.annotations  # left for the attempt that holds it
    assert keep_agent_log(cluster, job, str(results_dir), attempt=1, leaves_job=True)  # that attempt
    assert parts(results_dir) == [(1, b"printed\n")]


# -- the API, over HTTP ---------------------------------------------------------------------------


class FakeApi(BaseHTTPRequestHandler):
    """The API server's answers for one Job ``arbiter-x`` in namespace ``ns``: its pod
    ``arbiter-x-7xk2p`` (``pod``), and each log read's answer from ``logs`` (status, body,
    declared length), the last one lasting."""

    pod = None
    logs: list[tuple[int, bytes, int | None]] = []
    reads: list[dict] = []
    patches: list[dict] = []

    def do_GET(self) -> None:
        url = urlparse(self.path)
        if url.path == "/api/v1/namespaces/ns/pods":
            self.answer(200, json.dumps({"items": [ApiClient().sanitize_for_serialization(self.pod)]}).encode())
        elif url.path == "/api/v1/namespaces/ns/pods/arbiter-x-7xk2p/log":
            type(self).reads.append(parse_qs(url.query))
            status, body, length = self.logs[min(len(self.reads) - 1, len(self.logs) - 1)]
            self.answer(status, body, length)
        else:
            self.answer(404, b'{"kind": "Status", "code": 404}')

    def do_PATCH(self) -> None:
        body = self.rfile.read(int(self.headers["Content-Length"]))
        type(self).patches.append({"path": self.path, "body": json.loads(body)})
        self.answer(200, json.dumps({"kind": "Job", "metadata": {"name": "arbiter-x"}}).encode())

    def answer(self, status: int, body: bytes, length: int | None = None) -> None:
        self.send_response(status)
        self.send_header("Content-Type", "text/plain" if self.path.count("/log") else "application/json")
        self.send_header("Content-Length", str(len(body) if length is None else length))
        self.end_headers()
        self.wfile.write(body)
        self.close_connection = length is not None  # a response cut short: the connection goes

    def log_message(self, *args) -> None:
        pass


@pytest.fixture
def api(monkeypatch) -> Iterator[type[FakeApi]]:
    monkeypatch.setattr(kubernetes_cluster, "API_RETRY_S", 0.01)
    monkeypatch.setattr(kubernetes_cluster, "API_OUTAGE_S", 0.3)
    handler = type("Api", (FakeApi,), {"pod": a_pod("2030-01-01T00:00:00Z", agent=2), "reads": [], "patches": []})
    server = ThreadingHTTPServer(("127.0.0.1", 0), handler)
    handler.port = server.server_address[1]
    thread = threading.Thread(target=server.serve_forever, daemon=True)
    thread.start()
    try:
        yield handler
    finally:
        server.shutdown()
        server.server_close()
        thread.join()


def keep(api: type[FakeApi], results_dir: Path) -> bool:
    """``keep_agent_log`` through the real client, for a Job that attempt 4 created."""
    cluster = Cluster(Configuration(host=f"http://127.0.0.1:{api.port}"), "ns")
    try:
        job = V1Job(metadata=a_job().metadata)
        job.metadata.annotations = {ATTEMPT_ANNOTATION: "4"}
        return keep_agent_log(cluster, job, str(results_dir), attempt=9, leaves_job=True)
    finally:
        cluster.close()


def test_the_agent_containers_log_is_read_as_bytes_through_an_outage(api, tmp_path: Path) -> None:
    api.logs = [(503, b'{"kind": "Status", "code": 503}', None), (200, PRINTED, None)]
    assert keep(api, tmp_path)
    assert parts(tmp_path) == [(4, PRINTED)]
    assert len(api.reads) == 2 and api.reads[-1]["container"] == ["agent"] and api.reads[-1]["previous"] == ["False"]
    assert api.patches == [
        {
            "path": "/apis/batch/v1/namespaces/ns/jobs/arbiter-x",
            "body": {"metadata": {"annotations": {KEPT_ANNOTATION: "kept"}}},
        }
    ]


def test_a_restarted_container_gives_its_previous_instances_log_first(api, tmp_path: Path) -> None:
    agent = api.pod.status.container_statuses[0]
    agent.restart_count = 1
    agent.last_state = V1ContainerState(terminated=V1ContainerStateTerminated(exit_code=1, started_at=STARTED))
    api.logs = [(200, b"first instance\n", None), (200, b"second instance\n", None)]
    assert keep(api, tmp_path)
    assert [read["previous"] for read in api.reads] == [["True"], ["False"]]  # the API server reads True as true
    assert parts(tmp_path) == [
        (4, b"first instance\n=== arbiter: the agent's container restarted ===\nsecond instance\n")
    ]


@pytest.mark.parametrize(
    ("status", "reads"),
    [(400, 1), (403, 1), (500, None)],
    ids=["never-started", "forbidden", "api-down"],
)
def test_a_log_that_cannot_be_read_leaves_no_part_and_fails_nothing(api, tmp_path: Path, status, reads) -> None:
    said = (
        b'{"kind": "Status", "message": "container \\"agent\\" is waiting to start: trying and failing to pull image"}'
    )
    api.logs = [(status, said, None)]
    assert not keep(api, tmp_path)
    assert not (tmp_path / "agent.log").exists() and api.patches == []
    assert len(api.reads) == reads if reads else len(api.reads) > 1  # 5xx: tried again until the outage is over


def test_a_log_cut_off_midway_keeps_what_came_and_says_so(api, tmp_path: Path) -> None:
    printed = b"x" * (2 * READ_BYTES + 100)
    api.logs = [(200, printed, 4 * READ_BYTES)]  # the connection ends before the length it declared
    assert keep(api, tmp_path)
    ((_, kept),) = parts(tmp_path)
    # what came whole is kept (urllib3 drops the last read, cut short); a line says the rest is not
    said = re.fullmatch(rb"(x+)\n=== arbiter: the agent's log could not be read further: (.+) ===\n", kept)
    assert said and len(said.group(1)) == 2 * READ_BYTES and b"IncompleteRead" in said.group(2)
    assert len(api.reads) == 1

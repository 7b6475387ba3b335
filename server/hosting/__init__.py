"""Hosting a competition: submissions queued in Redis and evaluated by RQ workers on any number
of machines (``arbiter submit``, ``worker``, ``submissions``, ``cancel``).

- submissions.py: the submission record and its store in Redis;
- queue.py: arbiter's RQ queue (JSON serialization, job id = submission id);
- farm.py: submit and cancel, checked before anything is written;
- quotas.py: the per-participant daily limits of the competition's ``[hosting]`` table;
- job.py: what a worker runs for one submission (lock, attempts, resume, outcome);
- backends.py: where the agent runs (``local``: a process on the worker's machine);
- worker.py, reaper.py: the RQ worker and its pass over lost or overdue submissions.
"""

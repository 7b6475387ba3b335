# A base image for participants' agents: Python 3.11 with arbiter's client SDK installed
#
#   from arbiter.client import RemoteClient
#
# (flatland-rl 4.3.0 comes with it). Build from the repository root:
#
#   docker build -f docker/agent-base.Dockerfile -t arbiter-agent-base .
#
# A submission adds its own code on top, for example:
#
#   FROM arbiter-agent-base
#   USER root
#   COPY requirements.txt /tmp/requirements.txt
#   RUN pip install --no-cache-dir -r /tmp/requirements.txt
#   USER 10001:10001
#   COPY --chown=10001:10001 . /home/agent
#
# The agent gets no test set: it connects to the evaluator through ARBITER_REDIS_URL and
# AICROWD_SUBMISSION_ID, which the hosted setup puts in its environment.
FROM python:3.11-slim

ENV PYTHONDONTWRITEBYTECODE=1 \
    PYTHONUNBUFFERED=1 \
    PIP_DISABLE_PIP_VERSION_CHECK=1 \
    PIP_NO_CACHE_DIR=1 \
    PATH=/home/agent/.local/bin:$PATH

RUN groupadd --gid 10001 agent \
 && useradd --uid 10001 --gid 10001 --create-home --home-dir /home/agent --shell /bin/bash agent

WORKDIR /opt/arbiter
COPY setup.py pyproject.toml README.md ./
COPY protocol/ protocol/
COPY client/ client/
COPY server/ server/
RUN pip install --no-cache-dir . \
 && cd / && rm -rf /opt/arbiter

USER 10001:10001
WORKDIR /home/agent

CMD ["python", "run.py"]

# arbiter's evaluator for hosted evaluation: `arbiter serve`.
#
# The hidden test set is mounted read-only at /tests (never baked into the image); results go
# to /results. Connection settings come from the environment: ARBITER_REDIS_URL and
# AICROWD_SUBMISSION_ID (see docker/README.md). Build from the repository root:
#
#   docker build -f docker/evaluator.Dockerfile -t arbiter-evaluator .
FROM python:3.11-slim

ENV PYTHONDONTWRITEBYTECODE=1 \
    PYTHONUNBUFFERED=1 \
    PIP_DISABLE_PIP_VERSION_CHECK=1 \
    PIP_NO_CACHE_DIR=1

# A fixed numeric uid, so Kubernetes' runAsNonRoot can verify it.
RUN groupadd --gid 10001 arbiter \
 && useradd --uid 10001 --gid 10001 --create-home --shell /usr/sbin/nologin arbiter

# opencv-python (in the diambra extra) loads libGL and GLib when it is imported.
RUN apt-get update \
 && apt-get install -y --no-install-recommends libgl1 libglib2.0-0 \
 && rm -rf /var/lib/apt/lists/*

# Only what setup.py needs (it reads README.md); the source is removed after a regular install.
# The extras: diambra (the DIAMBRA format's env) and kubernetes (the same image runs
# `arbiter worker --backend kubernetes` in the cluster).
WORKDIR /opt/arbiter
COPY setup.py pyproject.toml README.md ./
COPY protocol/ protocol/
COPY client/ client/
COPY server/ server/
RUN pip install --no-cache-dir ".[diambra,kubernetes]" \
 && cd / && rm -rf /opt/arbiter

# /results exists and belongs to the evaluator's user, so a fresh named volume inherits it.
RUN mkdir -p /tests /results \
 && chown 10001:10001 /results

USER 10001:10001
WORKDIR /home/arbiter

ENTRYPOINT ["arbiter", "serve"]
CMD ["--tests", "/tests", "--results", "/results"]

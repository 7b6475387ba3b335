"""Fixtures of the hosting tests."""

from containers import podman_env  # noqa: F401 - the container tests' fixture

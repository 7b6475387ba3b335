"""The client tests' fixtures beyond the suite's own: podman's settings, for the fold test in a container."""

from containers import podman_env  # noqa: F401 - the container test's fixture

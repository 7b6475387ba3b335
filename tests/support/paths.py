"""Where things are, for tests that start processes or read the repository's files."""

from pathlib import Path

SUPPORT = Path(__file__).resolve().parent  # these helpers (on the tests' import path)
TESTS = SUPPORT.parent
REPO = TESTS.parent
EXAMPLES = REPO / "examples"

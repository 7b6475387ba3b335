"""Runs flatland-rl's own, unmodified evaluation service (it needs the main thread: it uses
SIGALRM timeouts), for the compatibility tests. Its settings (FLATLAND_* variables) are read
from the environment it is started with, as flatland reads them.

    python flatland_service_main.py TESTS_DIR SERVICE_ID REDIS_PORT RESULTS_CSV

Besides RESULTS_CSV, the service writes its evaluation state (the scores) next to it, as JSON.
"""

import sys

from flatland.evaluators.service import FlatlandRemoteEvaluationService

tests, service_id, port, results = sys.argv[1], sys.argv[2], int(sys.argv[3]), sys.argv[4]
service = FlatlandRemoteEvaluationService(
    test_env_folder=tests, flatland_rl_service_id=service_id, remote_port=port, result_output_path=results
)
outcome = service.run()
print("FLATLAND_SERVICE_RESULT", outcome["type"], flush=True)

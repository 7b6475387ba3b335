"""Runs flatland-rl's own, unmodified evaluation service (it needs the main thread: it uses
SIGALRM timeouts), for the compatibility tests.

    python flatland_service_main.py TESTS_DIR SERVICE_ID REDIS_PORT RESULTS_CSV
"""

import sys

from flatland.evaluators.service import FlatlandRemoteEvaluationService

tests, service_id, port, results = sys.argv[1], sys.argv[2], int(sys.argv[3]), sys.argv[4]
service = FlatlandRemoteEvaluationService(
    test_env_folder=tests, flatland_rl_service_id=service_id, remote_port=port, result_output_path=results
)
outcome = service.run()
print("FLATLAND_SERVICE_RESULT", outcome["type"], flush=True)

"""A schedule declared at import with the options in TEST_PERIODIC_OPTIONS (JSON): a
qcluster loading this module with a hostile one refuses to start
(tests/jobs/test_periodic_limits.py)."""

import json
import os

import jobs

jobs.periodic(
    "tests.noop", name="tests.hostile_at_start", **json.loads(os.environ["TEST_PERIODIC_OPTIONS"])
)

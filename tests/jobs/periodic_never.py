"""A schedule that can never fire (30 February): a qcluster loading this module refuses to
start (tests/jobs/test_periodic_limits.py)."""

import jobs

jobs.periodic("tests.noop", name="tests.never", cron="0 0 30 2 *")

"""A schedule whose kind no handler runs: a qcluster loading this module refuses to start
(tests/jobs/test_periodic_limits.py)."""

import jobs

jobs.periodic("tests.no_such_kind", name="tests.orphan_at_start", every=60)

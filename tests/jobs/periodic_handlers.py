"""A schedule declared at import, as an app's handlers module does (the qcluster tests)."""

import jobs
from tests.jobs import handlers  # noqa: F401 - tests.noop's handler

jobs.periodic("tests.noop", name="tests.every_second", every=1, overlap=True)

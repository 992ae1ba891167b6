"""A cheap password hash for the test process (issue 36 point 6: the suite's time budget).

Django hashes with PBKDF2 at 1,000,000 iterations: 0.56 s of CPU per
`create_user(password=...)`, `admin_user`, `client.login()` or failed `authenticate()`
here, and the suite does a great many (the admin and console tests, the browser tests'
staff users): sampled in the xdist workers of a whole run (py-spy, 2026-12-07), 47 s of
CPU in its second half alone; tests/inbound_email/test_admin.py and tests/ops/test_health.py
together went from 27.2 s to 12.6 s of CPU. The test process hashes with the same
algorithm at 1,000 iterations instead. Same algorithm name (`pbkdf2_sha256`) and format,
so a hash made here is checked by the default hasher of the child processes a test starts
(gunicorn, runserver, manage.py commands: the iterations are read from the hash), and a
hash they make is checked here. No test is about the work factor. Installed by
tests/conftest.py.
"""

from __future__ import annotations

from django.contrib.auth.hashers import PBKDF2PasswordHasher

FAST_HASHERS = [
    "tests.support.fast_password.FastPBKDF2PasswordHasher",
    # Django's defaults after it: whatever a child process wrote can still be read.
    "django.contrib.auth.hashers.PBKDF2PasswordHasher",
    "django.contrib.auth.hashers.PBKDF2SHA1PasswordHasher",
    "django.contrib.auth.hashers.Argon2PasswordHasher",
    "django.contrib.auth.hashers.BCryptSHA256PasswordHasher",
    "django.contrib.auth.hashers.ScryptPasswordHasher",
]


class FastPBKDF2PasswordHasher(PBKDF2PasswordHasher):
    """PBKDF2-SHA256 at 1,000 iterations: the test process's preferred hasher."""

    iterations = 1_000


def install() -> None:
    """The test process hashes with FastPBKDF2PasswordHasher (settings and the hashers'
    caches, which Django clears on `setting_changed`)."""
    from django.conf import settings
    from django.test.signals import setting_changed

    settings.PASSWORD_HASHERS = FAST_HASHERS
    setting_changed.send(
        sender=type(settings), setting="PASSWORD_HASHERS", value=FAST_HASHERS, enter=True
    )

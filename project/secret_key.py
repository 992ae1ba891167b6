"""SECRET_KEY: only a key of real strength, and a generated one for the embedded default.

Why it matters here more than in most Django projects: django-q2 signs every task it puts in
its broker table with SECRET_KEY and unpickles a row once the signature checks out. Whoever
holds the key and can INSERT a row gets code run by the cluster. A key printed in this
repository (the old development default, the .env.example placeholder) or a short one is
therefore refused at start-up, whatever DEBUG says.

Where the key comes from (settings.py calls `configured_key`):
- `SECRET_KEY` in the environment (or .env): must pass `weakness()`.
- unset, on the embedded default database (DATABASE_URL unset): `WORKER_VAR_DIR/secret_key`,
  a random key `scripts/run-worker` writes on the first start (`python -m project.secret_key
  ensure`), mode 0600. A real deployment never gets one: web and worker must share one key.

This module must not import Django's settings (the settings and the scripts use it first).

    python -m project.secret_key ensure    # write WORKER_VAR_DIR/secret_key unless it exists
    python -m project.secret_key generate  # print a new random key (scripts/test, images)
"""

from __future__ import annotations

import os
import secrets
import stat
import sys
from pathlib import Path

from django.core.checks.security.base import (
    SECRET_KEY_INSECURE_PREFIX,
    SECRET_KEY_MIN_LENGTH,
    SECRET_KEY_MIN_UNIQUE_CHARACTERS,
)
from django.core.exceptions import ImproperlyConfigured

KEY_FILE_NAME = "secret_key"
# Keys this repository has printed at some point: public, so never a deployment's key.
PUBLISHED_KEYS = frozenset(
    {
        "django-insecure-dev-only-never-use-in-production",  # the old DEBUG default
        "change-me-to-a-long-random-string",  # .env.example
        "build-only",  # the Dockerfile's collectstatic step, before issue 19
    }
)
GENERATE_HINT = "python -c 'import secrets; print(secrets.token_urlsafe(50))'"


def generate() -> str:
    return secrets.token_urlsafe(50)  # 67 characters, ~400 bits


def weakness(key: str) -> str | None:
    """Why `key` is not a real secret (Django's own check_secret_key criteria, plus the
    keys this repository published), or None when it is one."""
    if key in PUBLISHED_KEYS or key.startswith(SECRET_KEY_INSECURE_PREFIX):
        return "it is a published placeholder"
    if len(key) < SECRET_KEY_MIN_LENGTH:
        return f"it has {len(key)} characters, fewer than {SECRET_KEY_MIN_LENGTH}"
    if len(set(key)) < SECRET_KEY_MIN_UNIQUE_CHARACTERS:
        return f"it has fewer than {SECRET_KEY_MIN_UNIQUE_CHARACTERS} distinct characters"
    return None


def key_file(var_dir: Path) -> Path:
    return var_dir / KEY_FILE_NAME


def ensure(var_dir: Path) -> Path:
    """Write a random key to `var_dir/secret_key` (0600) unless the file exists.

    O_EXCL: of two first starts at once, one writes and the other keeps that key.
    """
    var_dir.mkdir(mode=0o700, parents=True, exist_ok=True)
    path = key_file(var_dir)
    try:
        fd = os.open(path, os.O_WRONLY | os.O_CREAT | os.O_EXCL, 0o600)
    except FileExistsError:
        return path
    with os.fdopen(fd, "w") as out:
        out.write(generate() + "\n")
    return path


def _read_key_file(path: Path) -> str:
    mode = path.stat().st_mode
    if mode & (stat.S_IRWXG | stat.S_IRWXO):
        raise ImproperlyConfigured(
            f"SECRET_KEY is unset and {path} is readable by other users: chmod 600 {path}"
        )
    return path.read_text().strip()


def configured_key(*, env_value: str, var_dir: Path, embedded: bool) -> str:
    """The deployment's SECRET_KEY, or ImproperlyConfigured in one line naming SECRET_KEY."""
    if env_value:
        why = weakness(env_value)
        if why:
            raise ImproperlyConfigured(
                f"SECRET_KEY is refused: {why}. Set SECRET_KEY to a long random value "
                f"({GENERATE_HINT})"
            )
        return env_value
    if not embedded:
        raise ImproperlyConfigured(
            "SECRET_KEY is not set: with DATABASE_URL, set SECRET_KEY (the same for web and "
            f"worker) to a long random value ({GENERATE_HINT})"
        )
    path = key_file(var_dir)
    if not path.is_file():
        raise ImproperlyConfigured(
            f"SECRET_KEY is not set and {path} does not exist: run scripts/run-worker (it "
            "writes one), `python -m project.secret_key ensure`, or set SECRET_KEY"
        )
    key = _read_key_file(path)
    why = weakness(key)
    if why:
        raise ImproperlyConfigured(
            f"SECRET_KEY is unset and the key in {path} is refused: {why}. Delete the file "
            "and run `python -m project.secret_key ensure`"
        )
    return key


def _var_dir() -> Path:
    """WORKER_VAR_DIR (also from .env), or ./var next to manage.py: the settings' rule."""
    root = Path(__file__).resolve().parent.parent
    if (root / ".env").is_file():
        import environ

        environ.Env.read_env(root / ".env", overwrite=False)
    return Path(os.environ.get("WORKER_VAR_DIR") or root / "var")


def main(argv: list[str]) -> int:
    if argv == ["ensure"]:
        print(ensure(_var_dir()))
        return 0
    if argv == ["generate"]:
        print(generate())
        return 0
    print("usage: python -m project.secret_key ensure|generate", file=sys.stderr)
    return 2


if __name__ == "__main__":
    sys.exit(main(sys.argv[1:]))

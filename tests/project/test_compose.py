"""docker-compose.yml has the shape docs/setup.md promises (no Docker engine runs in CI)."""

from __future__ import annotations

import yaml

from tests.support.processes import PROJECT_ROOT


def test_compose_runs_postgres_web_and_worker_on_one_env_file():
    compose = yaml.safe_load((PROJECT_ROOT / "docker-compose.yml").read_text())
    services = compose["services"]
    assert {"postgres", "web", "worker"} <= set(services)
    assert "pg_isready" in " ".join(services["postgres"]["healthcheck"]["test"])
    assert services["worker"]["command"] == ["python", "manage.py", "qcluster"]
    assert services["web"]["command"][0] == "gunicorn"
    assert services["web"]["env_file"] == services["worker"]["env_file"] == ".env"
    assert (PROJECT_ROOT / ".env.example").is_file()

# Sourced by the scripts: create .venv and install the project from its own pyproject.toml.
set -euo pipefail
ROOT="$(cd "$(dirname "${BASH_SOURCE[0]}")/.." && pwd)"
cd "$ROOT"
PYTHON="${PYTHON:-python3}"
if [ ! -x .venv/bin/python ]; then
  "$PYTHON" -m venv .venv
fi
# Re-install only when pyproject.toml changed since the last install.
STAMP=.venv/.installed-$(sha256sum pyproject.toml | cut -c1-16)
if [ ! -f "$STAMP" ]; then
  echo "Installing the project and its pinned dependencies into .venv (log: .venv/pip.log)" >&2
  if ! { .venv/bin/python -m pip install --upgrade pip \
         && .venv/bin/python -m pip install -e ".[test,embedded]"; } >.venv/pip.log 2>&1; then
    tail -30 .venv/pip.log >&2
    echo "pip install failed; see .venv/pip.log" >&2
    exit 1
  fi
  rm -f .venv/.installed-*
  touch "$STAMP"
fi
export PATH="$ROOT/.venv/bin:$PATH"

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
  .venv/bin/python -m pip install --quiet --upgrade pip
  .venv/bin/python -m pip install --quiet -e ".[test]"
  rm -f .venv/.installed-*
  touch "$STAMP"
fi
export PATH="$ROOT/.venv/bin:$PATH"

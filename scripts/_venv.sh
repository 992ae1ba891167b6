# Sourced by the scripts: create .venv and install the project from its own pyproject.toml,
# with the extras the caller names in VENV_EXTRAS (run-worker: "embedded", the runtime and the
# embedded database only; scripts/test: "test,embedded", adding pytest, moto, Playwright...).
set -euo pipefail
VENV_EXTRAS="${VENV_EXTRAS:-embedded}"
ROOT="$(cd "$(dirname "${BASH_SOURCE[0]}")/.." && pwd)"
cd "$ROOT"
PYTHON="${PYTHON:-python3}"
if [ ! -x .venv/bin/python ]; then
  "$PYTHON" -m venv .venv
fi
# Re-install only when pyproject.toml changed since the last install of these extras.
HASH=$(sha256sum pyproject.toml | cut -c1-16)
STAMP=.venv/.installed-$HASH-${VENV_EXTRAS//,/-}
if [ ! -f "$STAMP" ]; then
  echo "Installing the project and its pinned dependencies into .venv (log: .venv/pip.log)" >&2
  if ! { .venv/bin/python -m pip install --upgrade pip \
         && .venv/bin/python -m pip install -e ".[$VENV_EXTRAS]"; } >.venv/pip.log 2>&1; then
    tail -30 .venv/pip.log >&2
    echo "pip install failed; see .venv/pip.log" >&2
    exit 1
  fi
  find .venv -maxdepth 1 -name '.installed-*' ! -name ".installed-$HASH-*" -delete
  touch "$STAMP"
fi
export PATH="$ROOT/.venv/bin:$PATH"

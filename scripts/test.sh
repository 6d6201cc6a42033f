#!/usr/bin/env bash
# The test command: lint, then the whole suite (unit, e2e and bounded chaos tests).
set -euo pipefail
cd "$(dirname "$0")/.."
# The project venv made by scripts/setup.sh, whatever the caller has activated.
. .venv/bin/activate
ruff check sr tests bench examples deploy
exec python -m pytest -q "$@"

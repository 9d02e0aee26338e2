#!/usr/bin/env bash
# Shared set-up for scripts/demo.sh and scripts/test.sh: a virtualenv with so installed.
# Idempotent; safe to run again. Needs python3 (>= 3.11) with venv; nothing else.
set -euo pipefail
root="$(cd "$(dirname "${BASH_SOURCE[0]}")/.." && pwd)"
cd "$root"
python=${PYTHON:-python3}
if ! "$python" -c 'import sys; sys.exit(sys.version_info < (3, 11))' 2>/dev/null; then
  echo "so needs Python >= 3.11 (found: $("$python" --version 2>&1)); set PYTHON=/path/to/python3.11" >&2
  exit 1
fi
if [ ! -x .venv/bin/python ]; then
  "$python" -m venv .venv
fi
extra=${1:-}
.venv/bin/python -m pip install -q --disable-pip-version-check -e ".${extra}" 2>&1 \
  | grep -v "^WARNING: Location" || true
.venv/bin/so --version >/dev/null

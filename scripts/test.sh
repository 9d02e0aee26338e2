#!/usr/bin/env bash
# Everything the tests need, then all of them: lint, types, unit and integration tests
# (real bwrap, real git, the real pinned claude CLI against the scripted model server).
set -euo pipefail
root="$(cd "$(dirname "${BASH_SOURCE[0]}")/.." && pwd)"
cd "$root"
bash scripts/setup.sh "[test]"
if ! command -v npm >/dev/null 2>&1; then
  if [ "$(id -u)" = 0 ] && command -v apt-get >/dev/null 2>&1; then
    echo "test.sh: installing Node.js and npm (needed for the pinned agent CLIs)" >&2
    apt-get update -qq && apt-get install -y -qq nodejs npm >/dev/null
  else
    echo "test.sh: npm is needed to install the pinned claude CLI; install Node.js + npm" >&2
    exit 1
  fi
fi
export SO_AGENTS_DIR="$root/.cache/agents"
.venv/bin/so agents install claude jscpd  # pinned versions; a no-op when already there
.venv/bin/ruff check src tests
.venv/bin/mypy
.venv/bin/pytest "$@"

#!/usr/bin/env bash
# The main job, offline, on built-in defaults: a throwaway repo, a 3-iteration loop in a
# bwrap sandbox driven by the real claude CLI (installed via npm when node is present,
# else a built-in scripted agent) against the bundled scripted model server; then merge.
set -euo pipefail
root="$(cd "$(dirname "${BASH_SOURCE[0]}")/.." && pwd)"
bash "$root/scripts/setup.sh"
exec "$root/.venv/bin/so" demo "$@"

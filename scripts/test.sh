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
export SO_AGENTS_DIR="${SO_AGENTS_DIR:-$root/.cache/agents}"
.venv/bin/so agents install claude codex opencode pi jscpd  # pinned; no-op when present

# Docker parity tests: an engine and the offline base image (kept between runs). Without
# root (or a running engine) they are skipped, and pytest says why.
if [ "$(id -u)" = 0 ]; then
  if ! command -v dockerd >/dev/null 2>&1 || ! command -v debootstrap >/dev/null 2>&1; then
    echo "test.sh: installing docker.io and debootstrap" >&2
    apt-get update -qq && DEBIAN_FRONTEND=noninteractive apt-get install -y -qq docker.io debootstrap >/dev/null
  fi
  ping_docker() { .venv/bin/python -c 'import docker; docker.from_env().ping()' >/dev/null 2>&1; }
  if ! ping_docker; then
    echo "test.sh: starting dockerd (log: /tmp/so-dockerd.log)" >&2
    (dockerd >/tmp/so-dockerd.log 2>&1 &)
    for _ in $(seq 60); do ping_docker && break; sleep 1; done
  fi
  # The offline base; rebuilt when it predates python3 (the network forwarder needs it).
  if ping_docker && ! docker run --rm --network none so-base:bookworm python3 -c pass >/dev/null 2>&1; then
    .venv/bin/so image bootstrap
  fi
fi
.venv/bin/ruff check src tests
.venv/bin/mypy
.venv/bin/pytest "$@"

#!/usr/bin/env bash
# Install the coding agents that tests/node/agents.test.mjs drives against
# `kvchat serve` (issue 28): Codex CLI and Claude Code, pinned in
# tests/node/agents/package-lock.json, into tests/node/agents/node_modules
# with `npm ci`. Optional and large (about 800 MB): without them that test
# skips. Needs Node.js 20+ and npm (scripts/install-node-deps.sh installs
# them). Idempotent.
set -euo pipefail
cd "$(dirname "$0")/../tests/node/agents"
stamp=node_modules/.package-lock.json
if [ -f "$stamp" ] && [ "$stamp" -nt package-lock.json ] && [ "$stamp" -nt package.json ]; then
  exit 0
fi
npm ci --no-audit --no-fund --loglevel=error

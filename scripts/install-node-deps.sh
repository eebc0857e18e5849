#!/usr/bin/env bash
# Install what the Node.js API tests (tests/node) need: Node.js and npm from
# apt when missing, then the locked npm packages (the official `openai`,
# `@anthropic-ai/sdk` and `ollama` clients; the frameworks `ai` +
# `@ai-sdk/openai-compatible`, `@langchain/openai` + `@langchain/core` and
# `@openai/agents`, with `zod`) into tests/node/node_modules with `npm ci`.
# Idempotent: does nothing
# when node_modules is already up to date with package-lock.json. Installing
# Node.js needs root (or sudo). With a Node.js older than 20 it warns and
# exits 0: tests/test_node.c then skips.
set -euo pipefail
cd "$(dirname "$0")/../tests/node"

if ! command -v node >/dev/null 2>&1 || ! command -v npm >/dev/null 2>&1; then
  echo "installing: nodejs npm" >&2
  sudo=""
  [ "$(id -u)" -ne 0 ] && sudo="sudo"
  export DEBIAN_FRONTEND=noninteractive
  $sudo apt-get update -qq
  $sudo apt-get install -y -qq nodejs npm >/dev/null
fi

major=$(node -p 'process.versions.node.split(".")[0]')
if [ "$major" -lt 20 ]; then
  echo "install-node-deps: node $(node --version) is older than 20; the Node.js tests will skip" >&2
  exit 0
fi

stamp=node_modules/.package-lock.json
if [ -f "$stamp" ] && [ "$stamp" -nt package-lock.json ] && [ "$stamp" -nt package.json ]; then
  exit 0
fi
if [ -f package-lock.json ]; then
  npm ci --no-audit --no-fund --loglevel=error
else
  npm install --no-audit --no-fund --loglevel=error
fi

#!/usr/bin/env bash
# Install the Debian packages kvchat builds and tests with. Idempotent: does
# nothing when everything is present. Needs root (or sudo) only to install.
set -euo pipefail

pkgs=(gcc clang cmake ninja-build pkg-config libpcre2-dev libxxhash-dev libcjson-dev
      libmicrohttpd-dev libedit-dev
      python3-jinja2                 # the reference renderer of test_jinja (/usr/bin/python3)
      python3-jsonschema             # test_grammar_schema checks its outputs with it too
      libhiredis-dev                 # the shared KV tier in Redis
      redis-server haproxy curl)     # its tests, and deploy/cluster.sh

missing=()
for p in "${pkgs[@]}"; do
  dpkg-query -W -f='${Status}' "$p" 2>/dev/null | grep -q "install ok installed" || missing+=("$p")
done
[ ${#missing[@]} -eq 0 ] && exit 0

echo "installing: ${missing[*]}" >&2
sudo=""
[ "$(id -u)" -ne 0 ] && sudo="sudo"
export DEBIAN_FRONTEND=noninteractive
$sudo apt-get update -qq
$sudo apt-get install -y -qq "${missing[@]}" >/dev/null

#!/usr/bin/env bash
# Install the Debian packages kvchat needs. Idempotent: does nothing when
# everything is present. Needs root (or sudo) only to install.
#   scripts/install-deps.sh          what building kvchat needs (scripts/build.sh)
#   scripts/install-deps.sh --test   that, and what its tests need (scripts/test.sh)
# redis-server and haproxy (tests, deploy/cluster.sh) are started by the tests
# themselves: installing them never leaves a service running. policy-rc.d keeps
# their packages from starting them, and on a systemd host the units this
# script installed are disabled and stopped.
set -euo pipefail

build=(gcc cmake ninja-build pkg-config libpcre2-dev libxxhash-dev libcjson-dev
       libmicrohttpd-dev libedit-dev
       libhiredis-dev                 # the shared KV tier in Redis
       libjs-marked node-dompurify libjs-highlight.js libjs-katex)  # the chat page (embedded)
test=(clang                          # libFuzzer targets (-DKVC_FUZZ=ON)
      python3-jinja2                 # the reference renderer of test_jinja (/usr/bin/python3)
      python3-jsonschema             # test_grammar_schema checks its outputs with it too
      python3-cffi python3-pytest    # the Python package's tests (python/)
      redis-server haproxy curl      # the shared tier's tests, and deploy/cluster.sh
      valgrind                       # test_attention_valgrind: never-written K/V is never used
      chromium chromium-driver)      # the chat page's browser test (tests/webui)
services=(redis-server haproxy)      # packages that would start a service

case "${1:-}" in
  "") pkgs=("${build[@]}") ;;
  --test) pkgs=("${build[@]}" "${test[@]}") ;;
  *) echo "usage: $0 [--test]" >&2; exit 2 ;;
esac

missing=()
for p in "${pkgs[@]}"; do
  dpkg-query -W -f='${Status}' "$p" 2>/dev/null | grep -q "install ok installed" || missing+=("$p")
done
[ ${#missing[@]} -eq 0 ] && exit 0

echo "installing: ${missing[*]}" >&2
sudo=""
[ "$(id -u)" -ne 0 ] && sudo="sudo"
export DEBIAN_FRONTEND=noninteractive

# invoke-rc.d and deb-systemd-invoke ask policy-rc.d before starting a
# service: 101 = not allowed. Ours only when there is none, removed after.
policy=/usr/sbin/policy-rc.d
own_policy=""
if [ ! -e "$policy" ]; then
  printf '#!/bin/sh\n# scripts/install-deps.sh (kvchat): no service starts while it installs\nexit 101\n' |
    $sudo tee "$policy" >/dev/null
  $sudo chmod 755 "$policy"
  own_policy=1
fi
cleanup() { if [ -n "$own_policy" ]; then $sudo rm -f "$policy"; fi; }
trap cleanup EXIT

$sudo apt-get update -qq
$sudo apt-get install -y -qq "${missing[@]}" >/dev/null

# A systemd host enables the new units for the next boot: disable (and stop,
# should one have started anyway) those of the packages installed just now.
if [ -d /run/systemd/system ] && command -v systemctl >/dev/null 2>&1; then
  for s in "${services[@]}"; do
    for m in "${missing[@]}"; do
      [ "$m" = "$s" ] && $sudo systemctl disable --now "$s" >/dev/null 2>&1 || true
    done
  done
fi

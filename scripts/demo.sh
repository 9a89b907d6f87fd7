#!/usr/bin/env bash
# README command 1: install what is missing, build, run the main job on its embedded default.
set -euo pipefail
cd "$(dirname "$0")/.."
bash scripts/build.sh >/dev/null
exec "${VQ_BUILD_DIR:-build}/veloxquant" demo "$@"

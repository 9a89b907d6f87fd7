#!/usr/bin/env bash
# README command 2: install what is missing, build, run the whole test suite.
# CUDA tests (label `cuda`) skip with a message where no GPU is present.
set -euo pipefail
cd "$(dirname "$0")/.."
bash scripts/build.sh "$@"
bash scripts/fetch_tokenizers.sh
ctest --test-dir "${VQ_BUILD_DIR:-build}" --output-on-failure -j "$(nproc)" --timeout 600

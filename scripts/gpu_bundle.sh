#!/usr/bin/env bash
# scripts/gpu_bundle.sh [--no-bins] [cmake args...] — here (any Debian 12 machine, no GPU needed):
# packs what a GPU machine without network needs to run the CUDA tests and benches into
# .gpu-bundle/ (about 32 MB; carry it with the working tree):
#   deps.tar.xz  googletest's sources, the CLI11 / nlohmann-json / dlpack headers and ICU (headers
#                and libraries), from this machine's Debian packages, for a build there;
#   bins.tar.xz  vq_test_cuda, bench_decode_cuda and bench_runtime_decode built here in build-gpu (sm_90, -march=x86-64-v3,
#                glibc >= 2.34), with the command line and its tests (veloxquant, vq_test_e2e: they
#                need the bundled ICU), and bins.stamp, a hash of the sources they were built from.
# There: `source scripts/gpu_prepare.sh` (sets T and B to the two programs, E to the CLI's tests).
set -euo pipefail
cd "$(dirname "$0")/.."
bins=1
if [[ ${1:-} == --no-bins ]]; then bins=0; shift; fi
bash scripts/setup.sh
out=.gpu-bundle
mkdir -p "$out"
stage=$(mktemp -d)
trap 'rm -rf "$stage"' EXIT
mkdir -p "$stage/deps/include" "$stage/deps/icu/lib"
cp -r /usr/src/googletest "$stage/deps/googletest"
cp -r /usr/include/CLI /usr/include/nlohmann /usr/include/dlpack "$stage/deps/include/"
mkdir -p "$stage/deps/icu/include" && cp -r /usr/include/unicode "$stage/deps/icu/include/"
cp -a /usr/lib/x86_64-linux-gnu/libicu{data,uc,i18n}.so* "$stage/deps/icu/lib/"
tar cf - -C "$stage" deps | xz -T0 -6 > "$out/deps.tar.xz"
if [[ $bins == 1 ]]; then
  # the stamp of the sources the programs are built from, taken before the build: sources edited
  # while it runs would otherwise be stamped onto programs built from the older ones
  stamp=$(bash scripts/gpu_prepare.sh --stamp)
  if [[ ! -f build-gpu/build.ninja ]]; then
    cmake -S . -B build-gpu -G Ninja -DCMAKE_BUILD_TYPE=Release -DVQ_CUDA=ON -DVQ_NATIVE=OFF \
      -DCMAKE_CXX_FLAGS="-march=x86-64-v3" "$@" > /dev/null
  fi
  cmake --build build-gpu -j "$(nproc)" --target vq_test_cuda bench_decode_cuda veloxquant_cli vq_test_e2e \
    bench_runtime_decode
  # one stream with a dictionary larger than a program: the four share the same device code,
  # which xz then stores once (14 MB instead of 47)
  tar cf - -C build-gpu tests/vq_test_cuda bench/bench_decode_cuda veloxquant tests/vq_test_e2e \
    bench/bench_runtime_decode |
    xz -T1 --lzma2=preset=6,dict=192MiB > "$out/bins.tar.xz"
  if [[ "$(bash scripts/gpu_prepare.sh --stamp)" != "$stamp" ]]; then
    echo "gpu_bundle: the sources changed during the build; bins.stamp not written (run it again)" >&2
    rm -f "$out/bins.stamp"
    exit 1
  fi
  echo "$stamp" > "$out/bins.stamp"
fi
du -sh "$out"/*

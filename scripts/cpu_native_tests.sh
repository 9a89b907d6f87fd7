#!/usr/bin/env bash
# scripts/cpu_native_tests.sh [build dir] — builds the CPU attention and cache tests for this
# machine's own ISA (-march=native, no CUDA, no runtime) and runs them: the way to check the
# vector kernels of src/cpu/simd_vec.h on an ISA that CI's machine lacks (CI builds for its own,
# so AVX-512 paths only run where the machine has AVX-512: a GPU host, say). Prints which vector
# type the build took. On a machine without network, after `source scripts/gpu_prepare.sh` has
# unpacked .gpu-bundle/deps, it takes googletest and the headers from there.
set -euo pipefail
cd "$(dirname "$0")/.."
out=${1:-/tmp/vq-cpu-native}
if grep -q -w avx512f /proc/cpuinfo; then vec="V512 (AVX-512F)"
elif grep -q -w avx2 /proc/cpuinfo && grep -q -w f16c /proc/cpuinfo && grep -q -w fma /proc/cpuinfo; then vec="V256 (AVX2)"
else vec="none (scalar loops)"; fi
echo "cpu_native_tests: $(grep -m1 'model name' /proc/cpuinfo | cut -d: -f2 | xargs); vector type: $vec"
args=(-DCMAKE_BUILD_TYPE=Release -DVQ_CUDA=OFF -DVQ_BUILD_RUNTIME=OFF -DVQ_BUILD_BENCH=OFF -DVQ_BUILD_TOOLS=OFF)
deps=$PWD/.gpu-bundle/deps
if [[ -d $deps/googletest ]]; then
  args+=(-DVQ_GTEST_SOURCE_DIR=$deps/googletest "-DCMAKE_CXX_FLAGS=-isystem $deps/include")
fi
gen=()
command -v ninja > /dev/null && gen=(-G Ninja)
cmake -S . -B "$out" "${gen[@]}" "${args[@]}" > "$out.cmake.log" 2>&1 || { tail -20 "$out.cmake.log"; exit 1; }
cmake --build "$out" -j "$(nproc)" --target vq_test_ops vq_test_cache > "$out.build.log" 2>&1 ||
  { grep -m3 -A8 error "$out.build.log" | head -30; exit 1; }
rc=0
for t in vq_test_ops vq_test_cache; do
  "$out/tests/$t" > "$out.$t.log" 2>&1 || rc=1
  echo "$t: $(grep -E '^\[  (PASSED|FAILED)  \]' "$out.$t.log" | tr '\n' ' ')"
  grep -E '^\[  FAILED  \]' "$out.$t.log" | head -10 || true
done
exit $rc

# scripts/gpu_prepare.sh — on a GPU machine without network, in the repository root, with the
# .gpu-bundle/ that scripts/gpu_bundle.sh made: `source scripts/gpu_prepare.sh` sets T (the CUDA
# test program), B (bench_decode_cuda), E (the command line's tests, vq_test_e2e) and RD
# (bench_runtime_decode: the runtime's decode calls, eager against CUDA graphs). It takes
# the bundled programs when they were built from these sources and start here; otherwise it
# builds them in build-gpu with the bundled dependencies (nvcc from /usr/local/cuda).
# `bash scripts/gpu_prepare.sh --stamp` prints the hash of the sources (what bins.stamp holds).
vq_src_hash() {
  find src include tests bench tools CMakeLists.txt -type f ! -name '*.pyc' ! -path '*/__pycache__/*' |
    LC_ALL=C sort | xargs sha256sum | sha256sum | cut -c1-16
}
if [[ ${1:-} == --stamp ]]; then vq_src_hash; return 0 2>/dev/null || exit 0; fi
vq_unpack() {  # python's tarfile: the machine may have no xz; the 'data' filter where it exists
  python3 -c "
import sys, tarfile
t = tarfile.open(sys.argv[1])
try:
    t.extractall(sys.argv[2], filter='data')
except TypeError:
    t.extractall(sys.argv[2])" "$1" "$2"
}
bundle=.gpu-bundle
export VQ_TEST_DATA_DIR=$PWD/tests/data PATH=/usr/local/cuda/bin:$PATH
# the bundled programs need cuBLAS: the toolkit's, wherever this machine keeps it
export LD_LIBRARY_PATH=/usr/local/cuda/lib64:/usr/local/cuda/lib${LD_LIBRARY_PATH:+:$LD_LIBRARY_PATH}
T= B= E= RD=
if [[ -f $bundle/bins.tar.xz && "$(vq_src_hash)" == "$(cat $bundle/bins.stamp)" ]]; then
  vq_unpack $bundle/bins.tar.xz $bundle/prebuilt
  if $bundle/prebuilt/tests/vq_test_cuda --gtest_list_tests > /dev/null 2> $bundle/prebuilt.err; then
    T=$bundle/prebuilt/tests/vq_test_cuda B=$bundle/prebuilt/bench/bench_decode_cuda
    # the command line's tests (they run prebuilt/veloxquant) with the bundled ICU
    if [[ -x $bundle/prebuilt/tests/vq_test_e2e ]]; then
      [[ -d $bundle/deps ]] || vq_unpack $bundle/deps.tar.xz $bundle
      export LD_LIBRARY_PATH=$PWD/$bundle/deps/icu/lib:$LD_LIBRARY_PATH
      E=$bundle/prebuilt/tests/vq_test_e2e
    fi
    [[ -x $bundle/prebuilt/bench/bench_runtime_decode ]] && RD=$bundle/prebuilt/bench/bench_runtime_decode
    echo "gpu_prepare: the bundled programs"
  else
    echo "gpu_prepare: the bundled programs do not start here:"; head -3 $bundle/prebuilt.err
    ldd $bundle/prebuilt/tests/vq_test_cuda 2>&1 | grep "not found"
  fi
else
  echo "gpu_prepare: no bundled programs built from these sources"
fi
if [[ -z $T ]]; then
  [[ -d $bundle/deps ]] || vq_unpack $bundle/deps.tar.xz $bundle
  d=$PWD/$bundle/deps
  export LD_LIBRARY_PATH=$d/icu/lib${LD_LIBRARY_PATH:+:$LD_LIBRARY_PATH}
  vq_t0=$(date +%s)
  if cmake -S . -B build-gpu -G Ninja -DCMAKE_BUILD_TYPE=Release -DVQ_CUDA=ON -DVQ_GTEST_SOURCE_DIR=$d/googletest \
       -DICU_ROOT=$d/icu -DCMAKE_CXX_FLAGS="-isystem $d/include" -DCMAKE_CUDA_FLAGS="-isystem $d/include" > $bundle/build.log 2>&1 &&
     cmake --build build-gpu -j "$(nproc)" --target vq_test_cuda bench_decode_cuda >> $bundle/build.log 2>&1; then
    T=build-gpu/tests/vq_test_cuda B=build-gpu/bench/bench_decode_cuda
    cmake --build build-gpu -j "$(nproc)" --target veloxquant_cli vq_test_e2e >> $bundle/build.log 2>&1 &&
      E=build-gpu/tests/vq_test_e2e
    cmake --build build-gpu -j "$(nproc)" --target bench_runtime_decode >> $bundle/build.log 2>&1 &&
      RD=build-gpu/bench/bench_runtime_decode
    echo "gpu_prepare: built here in $(( $(date +%s) - vq_t0 )) s"
  else
    echo "gpu_prepare: the build failed ($bundle/build.log):"; grep -m3 -A8 error $bundle/build.log | head -30
  fi
fi

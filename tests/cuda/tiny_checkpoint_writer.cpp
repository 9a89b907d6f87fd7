// The runtime tests' tiny-checkpoint writer (tests/runtime/tiny_checkpoint.cpp), compiled into
// the CUDA test executable too: test_runtime_cuda.cpp writes checkpoints with head_dim 64, the
// smallest head size the device caches compile, next to the committed ones (head_dim 8..32).
#include "runtime/tiny_checkpoint.cpp"  // NOLINT(bugprone-suspicious-include)

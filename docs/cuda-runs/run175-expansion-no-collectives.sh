#!/usr/bin/env bash
# run 175: run 174's tree with vq_materialize_kernel's key rows inverse-transformed outside any
# branch and only the row's store predicated (run 174's SASS of <128, 4>: 160 SHFL wrapped in 80
# WARPSYNC / ENDCOLLECTIVE pairs, the compiler's fix-up for shuffles under control flow that
# depends on loaded values), three blocks of 256 a multiprocessor (80 registers, no spill). The
# prefill tests, the prefill table with its fp16 peer, every CUDA test, ncu on the expansion
# kernel alone, and the kernel's SASS opcode counts.
# Here: `bash scripts/gpu_bundle.sh`; there, with .gpu-bundle carried:
# `bash docs/cuda-runs/run175-expansion-no-collectives.sh`.
bash scripts/gpu_prefill.sh run175
source scripts/gpu_prepare.sh > /dev/null 2>&1
bash scripts/gpu_ncu_expansion.sh run175-ncu "$B"  # (the ncu command the run wrote out here, a helper since)
cuobjdump -sass $B | awk '/Function : .*vq_materialize_kernelILi128ELi4E/{f=1} f&&/Function : /&&!/vq_materialize_kernelILi128ELi4E/{f=0} f' > $OUT/run175-materialize-128-4.sass
grep -oE '^\s+/\*[0-9a-f]+\*/\s+(@!?U?P[0-9T] )?[A-Z0-9_.]+' $OUT/run175-materialize-128-4.sass | awk '{print $NF}' | sed 's/\..*//' | sort | uniq -c | sort -rn | head -24 | tr '\n' ' '; echo

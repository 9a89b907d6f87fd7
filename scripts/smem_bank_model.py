#!/usr/bin/env python3
"""Bank-conflict model of the decode kernel's codebook gathers (docs/cuda-kernels.md, "The
issue's bars"). A warp's 32 lanes each gather one 4-byte centroid word at a random code; lane l
reads copy l mod R of the codebook, and each copy lives in its own group of 32/R banks (entry e
of copy c in bank c*(32/R) + e mod (32/R)). One instruction costs as many shared-memory
wavefronts as the most-loaded bank has distinct words. Monte Carlo over random codes, then the
share of a token-head's wavefronts that are conflicts for the kernels' mix (key gathers + value
gathers + code ring), to set against ncu's measurement (run 142: d4b8 2.7%, the defaults 32-33%).

  python3 scripts/smem_bank_model.py [--trials 20000] [--seed 1]
"""
import argparse
import random


def wavefronts(copies, entries, trials, rng):
    """Mean wavefronts of one 32-lane gather of 4-byte words from `copies` bank-group copies."""
    group = 32 // copies
    total = 0
    for _ in range(trials):
        load = {}
        for lane in range(32):
            c, e = lane % copies, rng.randrange(entries)
            load.setdefault(c * group + e % group, set()).add((c, e))
        total += max(len(words) for words in load.values())
    return total / trials


def main():
    ap = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    ap.add_argument("--trials", type=int, default=20000)
    ap.add_argument("--seed", type=int, default=1)
    a = ap.parse_args()
    rng = random.Random(a.seed)
    print("copies x banks each: mean wavefronts per 32-lane 4-byte gather (4096 entries; 1.0 = conflict-free)")
    for copies in (4, 8, 16, 32):
        print(f"  {copies:2d} x {32 // copies:2d}: {wavefronts(copies, 4096, a.trials, rng):.3f}")
    # per token-head at head_dim 128, in conflict-free wavefronts (128 bytes each):
    #   d4b8 int8 keys: 32 key words (1), 32 fp16 d4 value centroids (2), code ring 64 B in + out (1);
    #   the defaults, int8 keys: 32 key words of d4b12 (1, from 8 copies of its 16 KB codebook: the
    #   228 KB block holds no more beside 8 value copies and the ring), 16 fp16 d8 value centroids
    #   by ldmatrix (2), code ring 64 B in + out (1)
    for name, copies, entries in (("d4b8/d4b8 i8 (32 key copies)", 32, 256), ("d4b12/d8b8 i8 (8 key copies)", 8, 4096)):
        k = wavefronts(copies, entries, a.trials, rng)
        ideal, actual = 1 + 2 + 1, k + 2 + 1
        print(f"{name}: key gather {k:.3f} wavefronts; conflicts {100 * (actual - ideal) / actual:.1f}% of the "
              f"token-head's wavefronts; {actual / ideal:.2f}x the conflict-free count")


if __name__ == "__main__":
    main()

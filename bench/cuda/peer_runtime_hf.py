#!/usr/bin/env python3
"""The peer of bench_runtime_decode: Hugging Face transformers' decode calls on the same model
shapes (the presets of bench/cuda/bench_runtime_decode.cpp: random bf16 weights, a 288-token
vocabulary, the same prompt length), measured the way that bench measures ours: wall clock per
call on the host, each call ending with its greedy token on the host.

Two rows per preset:
  hf eager   model(...) with a DynamicCache, every kernel launched from Python (sdpa attention);
  hf graph   the decode step with a StaticCache captured once into a torch.cuda.CUDAGraph and
             replayed (the token and position copied into the captured input tensors first), as
             our runtime replays its steps; skipped with the reason if the capture fails.

Run on the GPU machine (PyTorch is a peer there, never a dependency of veloxquant):
  python3 bench/cuda/peer_runtime_hf.py --preset qwen0.5b --ctx 4096 --steps 128
"""
import argparse
import sys
import time

import torch


def config_for(preset, positions):
    from transformers import LlamaConfig, Qwen2Config
    common = dict(vocab_size=288, max_position_embeddings=positions, torch_dtype="bfloat16", rms_norm_eps=1e-6)
    if preset == "qwen0.5b":
        return Qwen2Config(hidden_size=896, intermediate_size=4864, num_hidden_layers=24, num_attention_heads=14,
                           num_key_value_heads=2, tie_word_embeddings=True, rope_theta=1e6, **common)
    if preset == "llama8b-2l":
        return LlamaConfig(hidden_size=4096, intermediate_size=14336, num_hidden_layers=2, num_attention_heads=32,
                           num_key_value_heads=8, **common)
    if preset == "tiny":
        return LlamaConfig(hidden_size=256, intermediate_size=384, num_hidden_layers=2, num_attention_heads=4,
                           num_key_value_heads=2, **common)
    raise SystemExit(f"unknown preset {preset} (qwen0.5b, llama8b-2l, tiny)")


def static_cache(model, length):
    from transformers import StaticCache
    for kwargs in (dict(config=model.config, max_batch_size=1, max_cache_len=length, device="cuda",
                        dtype=torch.bfloat16),
                   dict(config=model.config, max_cache_len=length)):
        try:
            return StaticCache(**kwargs)
        except TypeError:
            continue
    raise RuntimeError("StaticCache: no known constructor")


def main():
    ap = argparse.ArgumentParser()
    ap.add_argument("--preset", default="qwen0.5b")
    ap.add_argument("--ctx", type=int, default=4096)
    ap.add_argument("--steps", type=int, default=128)
    ap.add_argument("--reps", type=int, default=3)
    a = ap.parse_args()
    from transformers import AutoModelForCausalLM
    import transformers
    torch.manual_seed(0)
    cfg = config_for(a.preset, a.ctx + a.steps + 64)
    cfg._attn_implementation = "sdpa"
    with torch.device("cuda"):
        model = AutoModelForCausalLM.from_config(cfg, torch_dtype=torch.bfloat16).eval()
    print(f"PEERRT device {torch.cuda.get_device_name()} torch {torch.__version__} transformers "
          f"{transformers.__version__} preset {a.preset} ctx {a.ctx} steps {a.steps}")
    prompt = torch.randint(0, cfg.vocab_size, (1, a.ctx), device="cuda")
    rows = {}

    @torch.inference_mode()
    def eager_round():
        from transformers import DynamicCache
        past = DynamicCache()
        out = None
        for i in range(0, a.ctx, 512):  # chunks of 512, as the bench prefills
            out = model(input_ids=prompt[:, i:i + 512], past_key_values=past, use_cache=True)
        nxt = int(out.logits[0, -1].argmax())
        for _ in range(8):
            out = model(input_ids=torch.tensor([[nxt]], device="cuda"), past_key_values=past, use_cache=True)
            nxt = int(out.logits[0, -1].argmax())
        torch.cuda.synchronize()
        t0 = time.perf_counter()
        for _ in range(a.steps):
            out = model(input_ids=torch.tensor([[nxt]], device="cuda"), past_key_values=past, use_cache=True)
            nxt = int(out.logits[0, -1].argmax())
        return (time.perf_counter() - t0) * 1e3 / a.steps

    @torch.inference_mode()
    def graph_round():
        past = static_cache(model, a.ctx + a.steps + 16)
        pos = 0
        out = None
        for i in range(0, a.ctx, 512):
            n = min(512, a.ctx - i)
            cp = torch.arange(pos, pos + n, device="cuda")
            out = model(input_ids=prompt[:, i:i + n], past_key_values=past, cache_position=cp,
                        position_ids=cp[None], use_cache=True)
            pos += n
        nxt = int(out.logits[0, -1].argmax())
        tok = torch.zeros((1, 1), dtype=torch.long, device="cuda")
        cpos = torch.zeros((1,), dtype=torch.long, device="cuda")

        def step():
            return model(input_ids=tok, past_key_values=past, cache_position=cpos, position_ids=cpos[None],
                         use_cache=True).logits

        s = torch.cuda.Stream()
        s.wait_stream(torch.cuda.current_stream())
        with torch.cuda.stream(s):  # warm-up on a side stream before the capture, as PyTorch asks
            for _ in range(3):
                tok.fill_(nxt)
                cpos.fill_(pos)
                step()
        torch.cuda.current_stream().wait_stream(s)
        # (the warm-up wrote position `pos` three times; the replays below overwrite it)
        g = torch.cuda.CUDAGraph()
        with torch.cuda.graph(g):
            logits = step()

        def replay():
            nonlocal nxt, pos
            tok.fill_(nxt)
            cpos.fill_(pos)
            g.replay()
            nxt = int(logits[0, -1].argmax())
            pos += 1

        for _ in range(8):
            replay()
        torch.cuda.synchronize()
        t0 = time.perf_counter()
        for _ in range(a.steps):
            replay()
        return (time.perf_counter() - t0) * 1e3 / a.steps

    for name, fn in (("hf eager", eager_round), ("hf graph", graph_round)):
        best = None
        try:
            for _ in range(a.reps):
                ms = fn()
                best = ms if best is None else min(best, ms)
        except Exception as e:  # report, keep the other row
            print(f"PEERRT {a.preset} {name}: failed: {type(e).__name__}: {str(e)[:300]}")
            continue
        rows[name] = best
        print(f"PEERRT {a.preset} {name}: {best:.4f} ms/step = {1000.0 / best:.0f} tokens/s")
        torch.cuda.empty_cache()
    return 0 if rows else 1


if __name__ == "__main__":
    sys.exit(main())

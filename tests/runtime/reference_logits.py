#!/usr/bin/env python3
"""Reference logits for the tiny checkpoints, computed by Hugging Face transformers (PyTorch).

For each checkpoint directory under tests/data/runtime/ this loads the model with
AutoModelForCausalLM in float32 with eager attention, runs the fixed prompt PROMPT, then
N_DECODE greedy decode steps with past_key_values (HF's own KV cache), and writes
<out>/<name>.safetensors with
    tokens          I32 [P + N_DECODE]       the prompt followed by the greedy tokens fed back
    next_token      I32 [1]                  the greedy choice after the last step
    logits          F32 [P + N_DECODE, V]    rows 0..P-1: the prefill's logits of every prompt
                                             position; row P+s: decode step s's logits
    logits_f64      F32 [P + N_DECODE, V]    the same model in float64, whole sequence at once
                                             (no cache), rounded to f32: the "truth" both
                                             float32 implementations are measured against
    rope_inv_freq   F32 [head_dim/2]         model.model.rotary_emb.inv_freq
    rope_attention_scaling F32 [1]           model.model.rotary_emb.attention_scaling
    tok_ids         I32 [n]                  tokenizers' encoding of TOKENIZER_TEXT with the
                                             checkpoint's tokenizer.json (add_special_tokens)
and __metadata__ with the torch / transformers / tokenizers versions.

The C++ tests (tests/runtime/test_reference.cpp) read these files; CI needs no PyTorch.
Run: python3 tests/runtime/reference_logits.py tests/data/runtime OUT_DIR
(it ran on the project's H200 machine, on its CPU: the reference is fp32 CPU maths).
"""
import os
import sys
import traceback

import torch
import transformers
from safetensors.torch import save_file

PROMPT = [3, 117, 260, 45, 200, 271, 9, 88, 150, 263, 32, 101]
N_DECODE = 20
TOKENIZER_TEXT = "the keys and the values of every token: 42 caches, é!"
CHECKPOINTS = ["tiny-llama", "tiny-qwen2", "tiny-qwen3", "tiny-mistral"]


def load_f32(path):
    kwargs = dict(attn_implementation="eager")
    try:
        model = transformers.AutoModelForCausalLM.from_pretrained(path, dtype=torch.float32, **kwargs)
    except TypeError:
        model = transformers.AutoModelForCausalLM.from_pretrained(path, torch_dtype=torch.float32, **kwargs)
    model.eval()
    for p in model.parameters():
        assert p.dtype == torch.float32, p.dtype
    return model


def reference(path):
    torch.manual_seed(0)
    model = load_f32(path)
    tensors = {}
    with torch.no_grad():
        out = model(torch.tensor([PROMPT]), use_cache=True)
        rows = [out.logits[0].float()]
        past = out.past_key_values
        tokens = list(PROMPT)
        nxt = int(out.logits[0, -1].argmax())
        for _ in range(N_DECODE):
            tokens.append(nxt)
            out = model(torch.tensor([[nxt]]), past_key_values=past, use_cache=True)
            past = out.past_key_values
            rows.append(out.logits[0].float())
            nxt = int(out.logits[0, -1].argmax())
        tensors["logits"] = torch.cat(rows).contiguous()
        tensors["tokens"] = torch.tensor(tokens, dtype=torch.int32)
        tensors["next_token"] = torch.tensor([nxt], dtype=torch.int32)
        rot = model.model.rotary_emb
        tensors["rope_inv_freq"] = rot.inv_freq.detach().float().contiguous()
        tensors["rope_attention_scaling"] = torch.tensor([float(rot.attention_scaling)], dtype=torch.float32)
        model64 = model.to(torch.float64)
        l64 = model64(torch.tensor([tokens]), use_cache=False).logits[0]
        tensors["logits_f64"] = l64.float().contiguous()
    try:
        import tokenizers
        tok = tokenizers.Tokenizer.from_file(os.path.join(path, "tokenizer.json"))
        tensors["tok_ids"] = torch.tensor(tok.encode(TOKENIZER_TEXT, add_special_tokens=True).ids, dtype=torch.int32)
    except Exception:  # the logits matter most; report and continue
        traceback.print_exc()
    d = (tensors["logits"] - tensors["logits_f64"]).abs().max().item()
    print(f"{os.path.basename(path)}: tokens {tokens[len(PROMPT):]} next {nxt}; "
          f"max |f32 - f64| = {d:.3e}; inv_freq {tensors['rope_inv_freq'].tolist()} "
          f"attention_scaling {float(rot.attention_scaling)}", flush=True)
    return tensors


def main():
    src, out = sys.argv[1], sys.argv[2]
    os.makedirs(out, exist_ok=True)
    meta = {"torch": torch.__version__, "transformers": transformers.__version__,
            "prompt": ",".join(map(str, PROMPT)), "n_decode": str(N_DECODE),
            "tokenizer_text": TOKENIZER_TEXT}
    try:
        import tokenizers
        meta["tokenizers"] = tokenizers.__version__
    except Exception:
        pass
    print(meta, flush=True)
    failed = 0
    for name in CHECKPOINTS:
        try:
            t = reference(os.path.join(src, name))
            save_file(t, os.path.join(out, name + ".safetensors"), metadata=meta)
        except Exception:
            failed += 1
            print(f"{name}: FAILED", flush=True)
            traceback.print_exc()
    sys.exit(1 if failed else 0)


if __name__ == "__main__":
    main()

#!/usr/bin/env python3
"""Times PyTorch's scaled_dot_product_attention (flash backend) on the attention shapes of an
infersched calibration run and writes our kernels' time beside it.

    python3 attention_vs_pytorch.py CALIBRATION_DIR [OUT_CSV]

Reads CALIBRATION_DIR/run.json (model shape, tensor parallelism) and samples.csv (the
decode_attention and prefill_attention rows: "N decodes, context up to L" and "S chunks of C
over M"), runs the same shapes in bf16 on the GPU (decode: one query per sequence over L keys;
prefill: C queries over M + C keys, causal aligned bottom-right as a chunk over cached context),
and writes OUT_CSV (default CALIBRATION_DIR/attention-vs-pytorch.csv) with both times per layer
and their ratio. Our times include appending the step's K and V to the paged cache; PyTorch's
are attention alone over contiguous K and V, so the ratio slightly favours PyTorch.
"""
import csv
import json
import re
import statistics
import sys
from pathlib import Path

import torch
import torch.nn.functional as F
from torch.nn.attention import SDPBackend, sdpa_kernel
from torch.nn.attention.bias import causal_lower_right


def timed_ms(fn, warmup=3, repeats=10):
    """Median ms of fn between CUDA events. fn is captured in a CUDA graph and replayed, so
    the time is the kernels' alone, without Python's launch overhead between them (as our
    Rust launches have next to none); eager launches where capture fails."""
    for _ in range(warmup):
        fn()
    torch.cuda.synchronize()
    try:
        graph = torch.cuda.CUDAGraph()
        with torch.cuda.graph(graph):
            fn()
        graph.replay()
        torch.cuda.synchronize()
        fn, mode = graph.replay, "cuda-graph"
    except RuntimeError:
        torch.cuda.synchronize()
        mode = "eager"
    times = []
    for _ in range(repeats):
        start = torch.cuda.Event(enable_timing=True)
        end = torch.cuda.Event(enable_timing=True)
        start.record()
        fn()
        end.record()
        end.synchronize()
        times.append(start.elapsed_time(end))
    return statistics.median(times), mode


def sdpa_ms(q, k, v, mask, causal):
    """Median ms of SDPA; the first backend that accepts the shapes, and its name."""
    for backend in (SDPBackend.FLASH_ATTENTION, SDPBackend.CUDNN_ATTENTION,
                    SDPBackend.EFFICIENT_ATTENTION):
        try:
            with sdpa_kernel(backend):
                run = lambda: F.scaled_dot_product_attention(
                    q, k, v, attn_mask=mask, is_causal=causal, enable_gqa=True)
                run()
                torch.cuda.synchronize()
                ms, mode = timed_ms(run)
                return ms, f"{backend.name.lower()} ({mode})"
        except RuntimeError:
            continue
    raise RuntimeError(f"no SDPA backend for q {tuple(q.shape)} k {tuple(k.shape)}")


def main():
    run_dir = Path(sys.argv[1])
    out = Path(sys.argv[2]) if len(sys.argv) > 2 else run_dir / "attention-vs-pytorch.csv"
    run = json.loads((run_dir / "run.json").read_text())
    model, tp = run["model"], max(1, run["tensor_parallel"])
    nh = model["heads"] // tp
    nkv = max(1, model["kv_heads"] // tp)
    d = model["head_dim"]
    dev, dt = "cuda", torch.bfloat16
    rows = []
    with open(run_dir / "samples.csv", newline="") as f:
        for s in csv.DictReader(f):
            cfg = s["config"]
            if s["group"] == "decode_attention":
                b, ctx = map(int, re.fullmatch(r"(\d+) decodes, context up to (\d+)", cfg).groups())
                q = torch.randn(b, nh, 1, d, device=dev, dtype=dt)
                k = torch.randn(b, nkv, ctx, d, device=dev, dtype=dt)
                v = torch.randn_like(k)
                ms, backend = sdpa_ms(q, k, v, None, False)
            elif s["group"] == "prefill_attention":
                seqs, c, m = map(int, re.fullmatch(r"(\d+) chunks of (\d+) over (\d+)", cfg).groups())
                q = torch.randn(seqs, nh, c, d, device=dev, dtype=dt)
                k = torch.randn(seqs, nkv, m + c, d, device=dev, dtype=dt)
                v = torch.randn_like(k)
                if m == 0:
                    ms, backend = sdpa_ms(q, k, v, None, True)
                else:
                    ms, backend = sdpa_ms(q, k, v, causal_lower_right(c, m + c), False)
            else:
                continue
            ours = float(s["measured_ms"])
            rows.append({"group": s["group"], "config": cfg, "ours_ms": f"{ours:.6f}",
                         "pytorch_ms": f"{ms:.6f}", "ratio": f"{ours / ms:.3f}",
                         "pytorch_backend": backend})
            del q, k, v
    with open(out, "w", newline="") as f:
        w = csv.DictWriter(f, fieldnames=list(rows[0].keys()))
        w.writeheader()
        w.writerows(rows)
    for group in ("decode_attention", "prefill_attention"):
        r = [float(x["ratio"]) for x in rows if x["group"] == group]
        if r:
            print(f"{group}: ours / PyTorch SDPA over {len(r)} shapes: median {statistics.median(r):.2f}, "
                  f"min {min(r):.2f}, max {max(r):.2f}")
    print(f"torch {torch.__version__} on {torch.cuda.get_device_name()}; wrote {out}")


if __name__ == "__main__":
    main()

#!/usr/bin/env python3
"""Refits a calibrated preset's recorded samples by absolute and by relative error (NNLS)
and scores each fit on the batches of whole schedules timed on the GPU
(results/GPU/MODEL/SCHEDULE/measured/batches.csv, written by `replay --on-gpu`).

    python3 refit.py [GPU]        (default h100; plain Python, no packages)

Prints, per model, fit and schedule: the per-batch median |error| and the error of the sum
of batch times. docs/cost-models.md, "Whole schedules timed on the GPU", quotes it.
"""
import csv
import json
import statistics
import sys
from pathlib import Path

FEATURES = ["one", "tokens", "decode_kv", "prefill_attn", "prefill_ctx",
            "n_prefill", "n_decode", "has_prefill", "has_decode"]
HERE = Path(__file__).resolve().parent
CALIBRATION = HERE.parent.parent / "calibration"


def nnls(rows, y, weights, sweeps=4000):
    """Least squares with theta >= 0 by cyclic coordinate descent on scaled columns."""
    n = len(FEATURES)
    scale = [max(1e-30, max(abs(r[k]) * w for r, w in zip(rows, weights))) for k in range(n)]
    a = [[r[k] * w / scale[k] for k in range(n)] for r, w in zip(rows, weights)]
    b = [v * w for v, w in zip(y, weights)]
    gram = [[sum(r[p] * r[q] for r in a) for q in range(n)] for p in range(n)]
    rhs = [sum(r[p] * v for r, v in zip(a, b)) for p in range(n)]
    x = [0.0] * n
    for _ in range(sweeps):
        for p in range(n):
            if gram[p][p] > 0:
                rest = rhs[p] - sum(gram[p][q] * x[q] for q in range(n) if q != p)
                x[p] = max(0.0, rest / gram[p][p])
    return [x[k] / scale[k] for k in range(n)]


def recorded_samples(run_dir):
    rows, y = [], []
    with open(run_dir / "samples.csv") as f:
        for r in csv.DictReader(f):
            rows.append([float(r[k]) for k in FEATURES])
            y.append(float(r["measured_ms"]))
    return rows, y


def schedule_batches(path, layers):
    rows, y = [], []
    with open(path) as f:
        for r in csv.DictReader(f):
            p, d = int(r["prefill_entries"]), int(r["decode_entries"])
            rows.append([1.0 if int(r["tokens"]) > 0 else 0.0, float(r["tokens"]),
                         float(r["decode_kv"]), float(r["prefill_attn"]),
                         float(r["prefill_ctx"]), p, d, float(p > 0), float(d > 0)])
            y.append(float(r["duration_s"]) * 1e3 / layers)
    return rows, y


def score(theta, rows, y):
    pred = [sum(t * f for t, f in zip(theta, r)) for r in rows]
    errors = [abs(p - m) / m * 100 for p, m in zip(pred, y)]
    return statistics.median(errors), (sum(pred) - sum(y)) / sum(y) * 100


def main():
    gpu = sys.argv[1] if len(sys.argv) > 1 else "h100"
    for model in ["llama2-7b", "llama3-8b"]:
        run_dir = CALIBRATION / gpu / model
        layers = json.loads((run_dir / "run.json").read_text())["model"]["layers"]
        rows, y = recorded_samples(run_dir)
        fits = {"absolute (the preset)": nnls(rows, y, [1.0] * len(y)),
                "relative": nnls(rows, y, [1.0 / v for v in y])}
        for name, theta in fits.items():
            print(f"{model} on {gpu}, fit by {name} error")
            for path in sorted((HERE / "results" / gpu / model).glob("*/measured/batches.csv")):
                median, total = score(theta, *schedule_batches(path, layers))
                print(f"  {path.parent.parent.name:8} per-batch |error| median {median:5.1f}%"
                      f"  sum of batch times {total:+5.1f}%")


if __name__ == "__main__":
    main()

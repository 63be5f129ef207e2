#!/usr/bin/env python3
"""Summary of a bench/gpu_suite.sh run: the engine_bench figures as ratios to
the limits measured in the same run, and the goals of the CUDA backend:

  - batch-1 decode (SwitchAll) >= 60% of the copy bandwidth on the bytes the
    step touched;
  - the 2048-token prefill (SwitchAll) >= 50% of the bf16 GEMM rate;
  - SwitchAll faster per token than the dense-attention baseline of matched
    parameters, in every benchmark;
  - >= 10x the PyTorch reference on the same GPU at batch 1 (in-process engine),
    in each dtype compare_pytorch.py ran it in (--ref-dtypes);
  - gRPC serving >= 0.9x the in-process engine at 32 clients.

  bench/gpu_summary.py --engine-bench OUT/engine_bench.json --compare OUT/compare_pytorch.txt
"""
import argparse
import json
import os
import re
import sys


def engine_rows(path):
    with open(path) as f:
        data = json.load(f)
    rows, errors = {}, []
    for b in data["benchmarks"]:
        if b.get("error_occurred"):
            errors.append(f"{b['name']}: {b.get('error_message', 'error')}")
            continue
        m = re.match(r"(decode|mixed|prefill)/(\w+)/(.*?)(/real_time)?$", b["name"])
        if m:
            rows[(m.group(1), m.group(2), m.group(3))] = b
    return data.get("context", {}), rows, errors


def compare_rows(path):
    """{(section, concurrency): {column: tokens/s or None}} from compare_pytorch.py's
    markdown tables, read by their header: "reference f32" (one column per
    --ref-dtypes), "engine", "gRPC"."""
    rows, section, columns = {}, None, None
    value = lambda s: None if s == "—" else float(s)  # noqa: E731
    with open(path) as f:
        for line in f:
            if line.startswith("## "):
                section, columns = line[3:].split(":")[0].strip(), None
            if not line.startswith("|"):
                continue
            cells = [c.strip() for c in line.strip().strip("|").split("|")]
            if cells[0] == "concurrency / batch":
                columns = cells
            elif section and columns and cells[0].isdigit() and len(cells) == len(columns):
                rows[(section, int(cells[0]))] = {
                    name[:-len(" tokens/s")]: value(cell)
                    for name, cell in zip(columns[1:], cells[1:]) if name.endswith(" tokens/s")}
    return rows


def main():
    ap = argparse.ArgumentParser(description=__doc__)
    ap.add_argument("--engine-bench", required=True)
    ap.add_argument("--compare", required=True)
    ap.add_argument("--smoke", action="store_true")
    args = ap.parse_args()
    try:
        context, rows, errors = engine_rows(args.engine_bench)
    except (OSError, ValueError) as e:  # no file, or one cut short by a timeout
        print(f"# no engine_bench results: {args.engine_bench}: {e}")
        return 1
    print("# switchserve on " + context.get("device", "?") +
          (" (SMOKE RUN on the SIMT executor: not GPU figures)" if args.smoke else ""))
    print(f"measured limits: copy {float(context.get('copy_gb_per_s', 0)):.1f} GB/s, "
          f"bf16 GEMM {float(context.get('gemm_bf16_tflops', 0)):.1f} TFLOP/s\n")
    print("| benchmark | time ms | tokens/s | GB/s | of copy bw | GFLOP/s | of GEMM |")
    print("| --- | --- | --- | --- | --- | --- | --- |")
    for (kind, model, shape), b in sorted(rows.items()):
        print(f"| {kind} {model} {shape} | {b['real_time']:.4g} | {b['tokens_per_s']:.4g} "
              f"| {b['gb_per_s']:.4g} | {b['gb_per_s_of_peak']:.3g} | {b['gflops']:.4g} "
              f"| {b['gflops_of_peak']:.3g} |")

    for error in errors:
        print(f"- ERROR: {error}")

    goals = []

    def goal(name, ok, detail):
        goals.append(ok)
        print(f"- {'PASS' if ok else 'FAIL'}: {name} ({detail})")

    print("\n## goals")
    # The shortest context's batch-1 step (a longer one reads mostly cache).
    decode1 = sorted(((int(re.search(r"context:(\d+)", s).group(1)), b)
                      for (k, m, s), b in rows.items()
                      if k == "decode" and m == "switchall" and s.startswith("batch:1/")
                      and "temperature" not in s),
                     key=lambda x: x[0])
    if decode1:
        r = decode1[0][1]["gb_per_s_of_peak"]
        goal("batch-1 decode >= 60% of the bandwidth roofline", r >= 0.6, f"{r:.2f}")
    prefill = [b for (k, m, s), b in rows.items() if k == "prefill" and m == "switchall"]
    if prefill:
        r = prefill[0]["gflops_of_peak"]
        goal("prefill >= 50% of the GEMM rate", r >= 0.5, f"{r:.3f}")
    for (kind, model, shape), b in sorted(rows.items()):
        dense = rows.get((kind, "dense", shape))
        if model == "switchall" and dense:
            ratio = b["tokens_per_s"] / dense["tokens_per_s"]
            goal(f"SwitchAll faster than the dense baseline, {kind} {shape}", ratio > 1,
                 f"{ratio:.2f}x")
    compare = {}
    if os.path.exists(args.compare):
        compare = compare_rows(args.compare)
    else:
        errors.append(f"no {args.compare}")
        print(f"- ERROR: no {args.compare}")
    for (section, c), row in sorted(compare.items()):
        eng, rpc = row.get("engine"), row.get("gRPC")
        refs = [name for name in row if name.startswith("reference")]
        for name in refs:  # one goal per reference dtype, named when there are several
            ref = row[name]
            if c == 1 and ref and eng:
                which = f"PyTorch {name}" if len(refs) > 1 else "PyTorch reference"
                goal(f"{section}: >= 10x the {which} at batch 1", eng / ref >= 10,
                     f"{eng / ref:.1f}x")
        if c == 32 and eng and rpc:
            goal(f"{section}: gRPC >= 0.9x the in-process engine at 32 clients", rpc / eng >= 0.9,
                 f"{rpc / eng:.2f}x")
    print(f"\n{sum(goals)} of {len(goals)} goals met")
    return 1 if errors else 0


if __name__ == "__main__":
    sys.exit(main())

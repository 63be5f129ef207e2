#!/usr/bin/python3
"""The roofline chart of engine_bench: every measured step (decode at each
batch, the CUDA run's mixed step, prefill; f32 and bf16 weights) at its
arithmetic intensity (FLOPs per byte of weights and cache it read) and
achieved GFLOP/s, under the two roofs measured in the same run: on the CPU
backend (--device=cpu) the memory read bandwidth and the sgemm rate, on the
CUDA backend (--device=cuda, whose report names its device) the
device-to-device copy bandwidth and the bf16 GEMM rate. Each point is
labelled with its model where that is not the SwitchAll model (the CUDA
run's dense baseline) and with its weights' dtype as the backend held them
(the CUDA backend holds engine_bench's f32 weights in bf16).

The roofs drawn are the medians of the limits measured beside each benchmark
(engine_bench's adjacent_read_gb_per_s and adjacent_sgemm_gflops), and each
label gives its step against the roofline measured beside it
(of_adjacent_roofline), as docs/performance.md's tables do. A reading taken
once at the process's start (machine_*) is used only for reports without the
adjacent limits (the CUDA backend's).

  build/release/bench/engine_bench --benchmark_out=engine_bench.json \\
      --benchmark_out_format=json [--benchmark_repetitions=3]
  /usr/bin/python3 bench/roofline_chart.py engine_bench.json docs/roofline.png \\
      [--only 'switchall(_bf16)?/.*(context:128/|tokens:512)']
  build/cuda-bench/bench/engine_bench --device=cuda --benchmark_out=engine_bench.json \\
      --benchmark_out_format=json
  /usr/bin/python3 bench/roofline_chart.py engine_bench.json roofline_cuda.png

With repetitions, the median of each benchmark is plotted.
--max-round-trip-ns NS keeps only the repetitions whose cores sat close
together (engine_bench's adjacent_round_trip_ns at most NS; bench/roofline.h)
and plots the medians of those: a VM whose host moves its vCPUs between
placements measures two machines in one run.
"""
import argparse
import collections
import json
import re
import statistics

import matplotlib

matplotlib.use("Agg")
import matplotlib.pyplot as plt  # noqa: E402


def label(name, cuda=False):
    """'decode/switchall_bf16/batch:32/context:128/real_time' -> 'decode, batch 32, bf16'.

    A context other than 128 tokens is named (', context 2000'); a model
    other than switchall is named before the dtype ('decode, batch 1, dense,
    bf16'); the model switchall_xl (XL positions) adds ', xl' after the
    weights' dtype. The CUDA backend (`cuda`) holds every model's weights in
    bf16; the CPU backend holds switchall_bf16's in bf16, the others' in f32."""
    fields = name.split("/")
    if len(fields) < 3 or fields[0] not in ("decode", "mixed", "prefill"):
        return name
    kind = fields[0]
    parts = dict(p.split(":", 1) for p in fields[2:] if ":" in p)
    family, dtype, xl = weights(fields[1], cuda)
    dtype = ("" if family == "switchall" else f"{family}, ") + dtype + (", xl" if xl else "")
    context = "" if parts.get("context", "128") == "128" else f", context {parts['context']}"
    if kind == "decode":
        return f"decode, batch {parts['batch']}{context}, {dtype}"
    if kind == "mixed":
        return (f"mixed, {parts['decoding']} decoding + {parts['prompts']} prompt tokens"
                f"{context}, {dtype}")
    return f"prefill {parts['tokens']} tokens, {dtype}"


def weights(model, cuda):
    """(model family, weights' dtype as held, XL positions) of an engine_bench model."""
    family = re.sub(r"_(bf16|xl)$", "", model)
    return family, "bf16" if cuda or model.endswith("_bf16") else "f32", model.endswith("_xl")


def on_cuda(report):
    """Whether engine_bench ran the CUDA backend: only its report names a device."""
    return "device" in report.get("context", {})


def run_name(b):
    """A benchmark entry's name without the aggregate's suffix."""
    return b.get("run_name", b["name"])


def points(report, max_round_trip_ns=None):
    """{label: benchmark entry}, the median aggregate when there are repetitions.

    With max_round_trip_ns, each entry holds the medians of the repetitions
    whose adjacent_round_trip_ns is at most that (and `repetitions_kept`); a
    benchmark with none left is left out."""
    runs = report["benchmarks"]
    cuda = on_cuda(report)
    if max_round_trip_ns is None:
        medians = [b for b in runs if b.get("aggregate_name") == "median"]
        chosen = medians if medians else [b for b in runs if b.get("run_type") != "aggregate"]
        return {label(run_name(b), cuda): b for b in chosen}
    kept = collections.defaultdict(list)
    for b in runs:
        if b.get("run_type") == "aggregate":
            continue
        if b.get("adjacent_round_trip_ns", float("inf")) <= max_round_trip_ns:
            kept[run_name(b)].append(b)
    result = {}
    for name, reps in kept.items():
        entry = dict(reps[0])
        for key, value in reps[0].items():
            if isinstance(value, (int, float)) and not isinstance(value, bool):
                entry[key] = statistics.median(r[key] for r in reps)
        entry["repetitions_kept"] = len(reps)
        result[label(name, cuda)] = entry
    return result


def main():
    ap = argparse.ArgumentParser(description=__doc__,
                                 formatter_class=argparse.RawDescriptionHelpFormatter)
    ap.add_argument("benchmark_json")
    ap.add_argument("png")
    ap.add_argument("--only", metavar="REGEX",
                    help="plot only the benchmarks whose names this matches (re.search)")
    ap.add_argument("--max-round-trip-ns", type=float, metavar="NS",
                    help="plot the medians of the repetitions whose adjacent_round_trip_ns "
                         "is at most NS only")
    args = ap.parse_args()
    with open(args.benchmark_json) as f:
        report = json.load(f)
    if args.only:
        report["benchmarks"] = [b for b in report["benchmarks"]
                                if re.search(args.only, run_name(b))]
    measured = points(report, args.max_round_trip_ns)
    if not measured:
        raise SystemExit("roofline_chart: no benchmark left to plot")
    adjacent = all("adjacent_read_gb_per_s" in b for b in measured.values())
    prefix = "adjacent_" if adjacent else "machine_"
    peak = statistics.median(b[prefix + "sgemm_gflops"] for b in measured.values())
    bandwidth = statistics.median(b[prefix + "read_gb_per_s"] for b in measured.values())

    def of_roof(b):
        if adjacent:
            return b["of_adjacent_roofline"]
        return b["gflops"] / min(peak, bandwidth * b["step_gflop"] / b["step_gb"])

    fig, ax = plt.subplots(figsize=(8, 5.5))
    intensities = [b["step_gflop"] / b["step_gb"] for b in measured.values()]
    lo, hi = min(intensities + [peak / bandwidth]) / 3, max(intensities + [peak / bandwidth]) * 3
    xs = [lo * (hi / lo) ** (i / 200) for i in range(201)]
    cuda = on_cuda(report)
    kernels = report.get("context", {}).get("sgemm_kernels")
    if cuda:
        roofs = f"copy {bandwidth:.1f} GB/s, bf16 GEMM {peak:.1f} GFLOP/s"
    else:
        roofs = (f"read {bandwidth:.1f} GB/s, sgemm {peak:.1f} GFLOP/s"
                 + (f" (OpenBLAS {kernels})" if kernels else ""))
    ax.plot(xs, [min(peak, bandwidth * x) for x in xs], color="black", linewidth=1.5,
            label=f"roofline: {roofs}")
    markers = {"decode": "o", "mixed": "D", "prefill": "s"}
    others = set()
    for name, b in sorted(measured.items()):
        x = b["step_gflop"] / b["step_gb"]
        y = b["gflops"]
        kind = name.split(",")[0].split(" ")[0]
        family, dtype, xl = weights((run_name(b).split("/") + [""])[1], cuda)
        other = family != "switchall"  # the CUDA run's dense baseline
        if other:
            others.add(family)
        ax.scatter([x], [y], marker=markers.get(kind, "s"), s=60, zorder=3,
                   color="tab:purple" if other else "tab:green" if xl
                   else "tab:blue" if dtype == "f32" else "tab:orange")
        # One benchmark's points (f32, bf16, xl; SwitchAll and another
        # model) sit close together: decode labels SwitchAll's bf16 to the
        # left of its point and the others to the right, xl and the other
        # model a line lower; prefill (whose points can be less than a label
        # apart) bf16 above, f32 below and xl or the other model a line
        # further down.
        bf16, xl = dtype == "bf16" and not other, xl or other
        if kind != "prefill":
            offset, ha = (-8 if bf16 else 8, -11 if xl else -3), "right" if bf16 else "left"
        else:
            offset, ha = (0, 7 if bf16 else -22 if xl else -13), "center"
        ax.annotate(f"{name}: {of_roof(b):.0%} of roof", (x, y), textcoords="offset points",
                    xytext=offset, ha=ha, fontsize=7)
    ax.set_xscale("log")
    ax.set_yscale("log")
    ax.set_xlabel("arithmetic intensity (FLOPs per byte of weights and KV cache read)")
    ax.set_ylabel("achieved GFLOP/s")
    context = report.get("context", {})
    machine = context["device"] if cuda else \
        f"{context.get('num_cpus', '?')} CPUs at {context.get('mhz_per_cpu', '?')} MHz"
    ax.set_title(f"engine_bench, paper's 262M SwitchAll shape, "
                 f"{'CUDA' if cuda else 'CPU'} backend\n"
                 f"{machine}, {context.get('date', '')[:16]}; blue f32 weights, orange bf16"
                 f"{', green f32 with XL positions' if any(n.endswith('xl') for n in measured) else ''}"
                 f"{''.join(f', purple {f}' for f in sorted(others))}\n"
                 + ("labels: of the roofline measured beside each step" if adjacent else
                    "labels: of the roofline measured once in the run")
                 + ("" if args.max_round_trip_ns is None else
                    f"; repetitions with a core round trip of at most "
                    f"{args.max_round_trip_ns:g} ns"), fontsize=9)
    ax.grid(True, which="both", linewidth=0.3)
    ax.legend(loc="lower right", fontsize=8)
    fig.tight_layout()
    fig.savefig(args.png, dpi=120)
    print(f"roofline: {roofs}")
    for name, b in sorted(measured.items()):
        x = b["step_gflop"] / b["step_gb"]
        kept = f", {b['repetitions_kept']} repetitions" if "repetitions_kept" in b else ""
        print(f"{name}: {x:.2f} FLOP/B, {b['gflops']:.1f} GFLOP/s, {of_roof(b):.0%} of roof{kept}")


if __name__ == "__main__":
    main()

#!/usr/bin/python3
"""Where the steps of engine_bench's timed loop spend their time on the CPU
backend: inside the worker pool's parallel jobs, or between them with the
engine thread working alone (routing, norms, small products, bookkeeping)
while the other cores wait. From a timeline written by
`engine_bench --pool-timeline=FILE` (cpu::WorkerPool::RecordJobs).

For each benchmark, its last timed run in FILE (Google Benchmark's reported
run, or the last repetition): the steps, the median step, the jobs a step
shares out, and the median share of a step inside jobs and its time between
them. With --jobs, also every job of a step in order, as medians over the
steps that ran the same jobs: its pieces, how many of them the engine thread
ran, its time, and the time before it (since the step began or the previous
job ended); the last row is the time after the last job.

  build/release/bench/engine_bench --benchmark_filter='decode/switchall_bf16/batch:1/' \\
      --pool-timeline=timeline.txt
  /usr/bin/python3 bench/pool_timeline.py timeline.txt [--jobs] [--filter REGEX]
"""
import argparse
import collections
import re
import statistics
import sys


def read_runs(path):
    """{benchmark: (step starts, jobs, end)} of each benchmark's last run;
    a job is (start, end, pieces, engine thread's pieces), times in ns."""
    runs = {}
    open_runs = collections.defaultdict(lambda: ([], []))
    with open(path) as f:
        for number, line in enumerate(f, 1):
            fields = line.split()
            if not fields:
                continue
            try:
                name, kind, values = fields[0], fields[1], [int(v) for v in fields[2:]]
                steps, jobs = open_runs[name]
                if kind == "step" and len(values) == 1:
                    steps.append(values[0])
                elif kind == "job" and len(values) == 4:
                    jobs.append(tuple(values))
                elif kind == "end" and len(values) == 1:
                    runs[name] = (sorted(steps), sorted(jobs), values[0])
                    del open_runs[name]
                else:
                    raise ValueError
            except (ValueError, IndexError):
                raise SystemExit(f"{path}:{number}: not a timeline line: {line.strip()!r}")
    return runs


def split_steps(starts, jobs, end):
    """Each step as (start, end, its jobs): the jobs that began within it."""
    bounds = starts + [end]
    steps, j = [], 0
    for i, start in enumerate(starts):
        stop = bounds[i + 1]
        first = j
        while j < len(jobs) and jobs[j][0] < stop:
            j += 1
        steps.append((start, stop, jobs[first:j]))
    return steps


def summary_row(name, steps):
    durations = [stop - start for start, stop, _ in steps]
    inside = [sum(e - s for s, e, _, _ in jobs) for _, _, jobs in steps]
    shares = [i / d for i, d in zip(inside, durations) if d > 0]
    between = [d - i for d, i in zip(durations, inside)]
    return (f"| {name} | {len(steps)} | {statistics.median(durations) / 1e3:.1f} µs "
            f"| {statistics.median(len(jobs) for _, _, jobs in steps):g} "
            f"| {statistics.median(shares):.3f} | {statistics.median(between) / 1e3:.1f} µs |")


def job_rows(steps):
    """Medians by position over the steps whose jobs had the most common
    sequence of piece counts."""
    shapes = collections.Counter(tuple(j[2] for j in jobs) for _, _, jobs in steps)
    shape, count = shapes.most_common(1)[0]
    same = [(start, stop, jobs) for start, stop, jobs in steps
            if tuple(j[2] for j in jobs) == shape]
    rows = [f"steps with these jobs: {count} of {len(steps)}", "",
            "| job | pieces | engine thread's | µs | µs before |", "| --- | --- | --- | --- | --- |"]
    for k, pieces in enumerate(shape):
        took = statistics.median(jobs[k][1] - jobs[k][0] for _, _, jobs in same)
        before = statistics.median(jobs[k][0] - (jobs[k - 1][1] if k else start)
                                   for start, _, jobs in same)
        mine = statistics.median(jobs[k][3] for _, _, jobs in same)
        rows.append(f"| {k + 1} | {pieces} | {mine:g} | {took / 1e3:.1f} | {before / 1e3:.1f} |")
    after = statistics.median(stop - (jobs[-1][1] if jobs else start) for start, stop, jobs in same)
    rows.append(f"| after the last | | | | {after / 1e3:.1f} |")
    return rows


def main():
    ap = argparse.ArgumentParser(description=__doc__,
                                 formatter_class=argparse.RawDescriptionHelpFormatter)
    ap.add_argument("timeline", help="the file engine_bench --pool-timeline wrote")
    ap.add_argument("--jobs", action="store_true", help="every job of a step, in order")
    ap.add_argument("--filter", default="", help="only benchmarks whose name matches (re.search)")
    args = ap.parse_args()
    runs = {name: run for name, run in read_runs(args.timeline).items()
            if re.search(args.filter, name)}
    runs = {name: run for name, run in runs.items() if run[0]}
    if not runs:
        raise SystemExit(f"{args.timeline}: no timed steps" +
                         (f" of a benchmark matching {args.filter!r}" if args.filter else ""))
    print("| benchmark | steps | step (median) | jobs a step | inside jobs | between jobs |")
    print("| --- | --- | --- | --- | --- | --- |")
    split = {name: split_steps(*run) for name, run in runs.items()}
    for name, steps in split.items():
        print(summary_row(name, steps))
    if args.jobs:
        for name, steps in split.items():
            print(f"\n{name}\n")
            print("\n".join(job_rows(steps)))
    return 0


if __name__ == "__main__":
    sys.exit(main())

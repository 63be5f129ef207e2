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
ran, its time, the time at its end that a thread had no piece left to take
while another ran its last (from the first of the engine thread and the
workers to run out of pieces; the whole job where no worker took one), and
the time before it (since the step began or the previous job ended); the
last row is the time after the last job.

With --period N --ratio A+B/C+D, the time of jobs A and B over that of jobs
C and D, positions counted from 1 within each period of N jobs from a step's
first job (a layer: 12 jobs a layer in a prefill of the paper's shape), as
the median and quartiles over every whole period of those steps: two jobs
of the same step share whatever the machine did meanwhile, so on a shared
machine this ratio holds far steadier than either time. --ratio step/C+D
takes the whole step (from its start to its end, the time between jobs
included) over jobs C and D of all its whole periods: a change that moves
work between jobs, or adds jobs, shows there against jobs it left alone.

  build/release/bench/engine_bench --benchmark_filter='decode/switchall_bf16/batch:1/' \\
      --pool-timeline=timeline.txt
  /usr/bin/python3 bench/pool_timeline.py timeline.txt [--jobs] [--filter REGEX]
      [--period N --ratio A+B/C+D | --ratio step/C+D]
"""
import argparse
import collections
import re
import statistics
import sys


def read_runs(path):
    """{benchmark: (step starts, jobs, end)} of each benchmark's last run;
    a job is (start, end, pieces, engine thread's pieces, when the engine
    thread ran out of pieces, when the workers did or 0), times in ns; a
    timeline of an older engine_bench has no such times (both 0)."""
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
                elif kind == "job" and len(values) in (4, 6):
                    jobs.append(tuple(values + [0] * (6 - len(values))))
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
    inside = [sum(j[1] - j[0] for j in jobs) for _, _, jobs in steps]
    shares = [i / d for i, d in zip(inside, durations) if d > 0]
    between = [d - i for d, i in zip(durations, inside)]
    return (f"| {name} | {len(steps)} | {statistics.median(durations) / 1e3:.1f} µs "
            f"| {statistics.median(len(jobs) for _, _, jobs in steps):g} "
            f"| {statistics.median(shares):.3f} | {statistics.median(between) / 1e3:.1f} µs |")


def most_common_jobs(steps):
    """The most common sequence of piece counts, how many steps had it, and
    those steps."""
    shapes = collections.Counter(tuple(j[2] for j in jobs) for _, _, jobs in steps)
    shape, count = shapes.most_common(1)[0]
    return shape, count, [(start, stop, jobs) for start, stop, jobs in steps
                          if tuple(j[2] for j in jobs) == shape]


def uneven_ns(job):
    """How long before a job's end the first thread ran out of pieces to
    take: the engine thread or the workers, or the job's start where no
    worker took a piece; 0 in a timeline without these times."""
    start, end, _, _, caller_end, workers_end = job
    if caller_end == 0:
        return 0
    return end - min(caller_end, workers_end if workers_end else start)


def job_rows(steps):
    """Medians by position over the steps whose jobs had the most common
    sequence of piece counts."""
    shape, count, same = most_common_jobs(steps)
    rows = [f"steps with these jobs: {count} of {len(steps)}", "",
            "| job | pieces | engine thread's | µs | µs uneven | µs before |",
            "| --- | --- | --- | --- | --- | --- |"]
    for k, pieces in enumerate(shape):
        took = statistics.median(jobs[k][1] - jobs[k][0] for _, _, jobs in same)
        before = statistics.median(jobs[k][0] - (jobs[k - 1][1] if k else start)
                                   for start, _, jobs in same)
        mine = statistics.median(jobs[k][3] for _, _, jobs in same)
        uneven = statistics.median(uneven_ns(jobs[k]) for _, _, jobs in same)
        rows.append(f"| {k + 1} | {pieces} | {mine:g} | {took / 1e3:.1f} | {uneven / 1e3:.1f} "
                    f"| {before / 1e3:.1f} |")
    after = statistics.median(stop - (jobs[-1][1] if jobs else start) for start, stop, jobs in same)
    rows.append(f"| after the last | | | | | {after / 1e3:.1f} |")
    return rows


def parse_ratio(spec, period):
    """([numerator positions] or None for "step", [denominator positions]),
    0-based, of "A+B/C+D" or "step/C+D" (1-based positions within a period)."""
    parts = spec.split("/")
    try:
        sides = [None if side == "step" and i == 0 else [int(p) - 1 for p in side.split("+")]
                 for i, side in enumerate(parts)]
    except ValueError:
        sides = []
    if (len(sides) != 2 or sides[1] is None or
            any(not 0 <= p < period for side in sides if side is not None for p in side)):
        raise SystemExit(f"--ratio {spec!r}: want A+B/C+D or step/C+D, job positions 1 to {period}")
    return sides


def ratio_row(name, steps, period, spec):
    numerator, denominator = parse_ratio(spec, period)
    _, count, same = most_common_jobs(steps)
    ratios = []
    for start, stop, jobs in same:
        below_step = 0
        for first in range(0, len(jobs) - period + 1, period):
            took = [j[1] - j[0] for j in jobs[first:first + period]]
            below = sum(took[p] for p in denominator)
            below_step += below
            if numerator is not None and below > 0:
                ratios.append(sum(took[p] for p in numerator) / below)
        if numerator is None and below_step > 0:
            ratios.append((stop - start) / below_step)
    unit = "steps" if numerator is None else f"periods of {count} steps"
    if not ratios:
        return f"{name}: no whole period of {period} jobs"
    q1, median, q3 = (statistics.quantiles(ratios, n=4) if len(ratios) > 1 else ratios * 3)
    return (f"{name}: {'' if numerator is None else 'jobs '}{spec} per period of {period}: "
            f"median {median:.3f} (quartiles {q1:.3f}-{q3:.3f}) over {len(ratios)} {unit}")


def main():
    ap = argparse.ArgumentParser(description=__doc__,
                                 formatter_class=argparse.RawDescriptionHelpFormatter)
    ap.add_argument("timeline", help="the file engine_bench --pool-timeline wrote")
    ap.add_argument("--jobs", action="store_true", help="every job of a step, in order")
    ap.add_argument("--filter", default="", help="only benchmarks whose name matches (re.search)")
    ap.add_argument("--period", type=int, default=0, help="jobs in a period (a layer), for --ratio")
    ap.add_argument("--ratio", help="A+B/C+D: jobs' time over other jobs' time, within each period")
    args = ap.parse_args()
    if (args.ratio is None) != (args.period <= 0):
        ap.error("--ratio and --period N (N >= 1) go together")
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
    if args.ratio is not None:
        print()
        for name, steps in split.items():
            print(ratio_row(name, steps, args.period, args.ratio))
    return 0


if __name__ == "__main__":
    sys.exit(main())

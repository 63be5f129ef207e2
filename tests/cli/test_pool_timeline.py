"""bench/pool_timeline.py on a small timeline in engine_bench's
--pool-timeline format: a step's share inside the pool's jobs, its time
between them, and each job in order; only a benchmark's last timed run
counts; a line of another form is refused."""
import pathlib
import subprocess
import sys

ROOT = pathlib.Path(__file__).resolve().parents[2]
TIMELINE = ROOT / "bench" / "pool_timeline.py"

NAME = "decode/switchall_bf16/batch:1/context:128"

# A calibration run (one step, no job), then the run that counts: two steps
# of 100 us, each with a job of 8 pieces (30 us) and one of 4 (40 us), 10 us
# apart and 10 us from either end of the step.
LINES = [
    f"{NAME} step 0",
    f"{NAME} end 5000",
    f"{NAME} step 1000000",
    f"{NAME} step 1100000",
    f"{NAME} job 1010000 1040000 8 4",
    f"{NAME} job 1050000 1090000 4 2",
    f"{NAME} job 1110000 1140000 8 3",
    f"{NAME} job 1150000 1190000 4 2",
    f"{NAME} end 1200000",
]


def run(tmp_path, lines, *args):
    path = tmp_path / "timeline.txt"
    path.write_text("\n".join(lines) + "\n")
    return subprocess.run([sys.executable, str(TIMELINE), str(path), *args],
                          capture_output=True, text=True)


def test_a_step_inside_and_between_jobs(tmp_path):
    out = run(tmp_path, LINES)
    assert out.returncode == 0, out.stderr
    assert f"| {NAME} | 2 | 100.0 µs | 2 | 0.700 | 30.0 µs |" in out.stdout


def test_each_job_in_order(tmp_path):
    out = run(tmp_path, LINES, "--jobs")
    assert out.returncode == 0, out.stderr
    rows = out.stdout.splitlines()
    assert "steps with these jobs: 2 of 2" in rows
    # An older timeline has no times of the threads running out: uneven 0.
    assert "| 1 | 8 | 3.5 | 30.0 | 0.0 | 10.0 |" in rows
    assert "| 2 | 4 | 2 | 40.0 | 0.0 | 10.0 |" in rows
    assert "| after the last | | | | | 10.0 |" in rows


def test_how_long_a_thread_had_no_piece_left(tmp_path):
    # Step 1: job 1's caller ran out at 25 us of 30, the workers at 28 (5 us
    # uneven); job 2's workers first, at 20 of 40 (20 us). Step 2: job 1's
    # workers took no piece (the whole 30 us); job 2's caller at 30 of 40,
    # the workers at 40 (10 us). Medians: 17.5 and 15.
    lines = [
        f"{NAME} step 1000000",
        f"{NAME} step 1100000",
        f"{NAME} job 1010000 1040000 8 4 1035000 1038000",
        f"{NAME} job 1050000 1090000 4 2 1090000 1070000",
        f"{NAME} job 1110000 1140000 8 8 1140000 0",
        f"{NAME} job 1150000 1190000 4 2 1180000 1190000",
        f"{NAME} end 1200000",
    ]
    out = run(tmp_path, lines, "--jobs")
    assert out.returncode == 0, out.stderr
    rows = out.stdout.splitlines()
    assert "| 1 | 8 | 6 | 30.0 | 17.5 | 10.0 |" in rows
    assert "| 2 | 4 | 2 | 40.0 | 15.0 | 10.0 |" in rows


def test_nothing_matching_and_a_bad_line_are_errors(tmp_path):
    out = run(tmp_path, LINES, "--filter", "prefill")
    assert out.returncode != 0
    assert "no timed steps of a benchmark matching 'prefill'" in out.stderr
    out = run(tmp_path, LINES + [f"{NAME} job 1 2 3"])
    assert out.returncode != 0
    assert "timeline.txt:10: not a timeline line" in out.stderr


# One step of six jobs in periods of two (two "layers" of jobs a and b, then
# a third): a 10, b 20; a 30, b 40; a 50, b 60 us.
PERIODS = [
    f"{NAME} step 1000000",
    f"{NAME} job 1000000 1010000 8 4",
    f"{NAME} job 1010000 1030000 8 4",
    f"{NAME} job 1030000 1060000 8 4",
    f"{NAME} job 1060000 1100000 8 4",
    f"{NAME} job 1100000 1150000 8 4",
    f"{NAME} job 1150000 1210000 8 4",
    f"{NAME} end 1300000",
]


def test_a_ratio_of_jobs_per_period(tmp_path):
    # a / b: 0.5, 0.75, 0.833; a / (a + b): 0.333, 0.429, 0.455.
    out = run(tmp_path, PERIODS, "--period", "2", "--ratio", "1/2")
    assert out.returncode == 0, out.stderr
    assert f"{NAME}: jobs 1/2 per period of 2: median 0.750 " in out.stdout
    assert "over 3 periods of 1 steps" in out.stdout
    out = run(tmp_path, PERIODS, "--period", "2", "--ratio", "1/1+2")
    assert out.returncode == 0, out.stderr
    assert "median 0.429 " in out.stdout
    # Periods of four: one whole period (the last two jobs are left out).
    out = run(tmp_path, PERIODS, "--period", "4", "--ratio", "4/1+2")
    assert out.returncode == 0, out.stderr
    assert "median 1.333 (quartiles 1.333-1.333) over 1 periods" in out.stdout


def test_a_step_over_jobs(tmp_path):
    # The step (300 us, to the end, the time after the last job included)
    # over jobs b of its three whole periods of two (20 + 40 + 60 us): 2.5;
    # over a and b of its one whole period of four (10 + 20 + 30 + 40): 3.0.
    for period, spec, median in (("2", "step/2", "2.500"), ("4", "step/1+2+3+4", "3.000")):
        out = run(tmp_path, PERIODS, "--period", period, "--ratio", spec)
        assert out.returncode == 0, out.stderr
        assert (f"{NAME}: {spec} per period of {period}: median {median} "
                f"(quartiles {median}-{median}) over 1 steps") in out.stdout


def test_a_ratio_needs_positions_within_the_period(tmp_path):
    out = run(tmp_path, PERIODS, "--period", "2", "--ratio", "1/3")
    assert out.returncode != 0
    assert "--ratio '1/3': want A+B/C+D or step/C+D, job positions 1 to 2" in out.stderr
    out = run(tmp_path, PERIODS, "--period", "2", "--ratio", "2/step")
    assert out.returncode != 0
    assert "want A+B/C+D or step/C+D" in out.stderr
    out = run(tmp_path, PERIODS, "--ratio", "1/2")
    assert out.returncode != 0
    assert "--ratio and --period N" in out.stderr

"""bench/roofline_chart.py on a small engine_bench report: the medians it
plots, with and without --max-round-trip-ns (the repetitions of one placement
of the cores); a CUDA run's models and weights."""
import json
import pathlib
import subprocess
import sys

ROOT = pathlib.Path(__file__).resolve().parents[2]
CHART = ROOT / "bench" / "roofline_chart.py"

DECODE = "decode/switchall_bf16/batch:1/context:128/real_time"
PREFILL = "prefill/switchall_bf16/tokens:512/real_time"


def repetition(name, of_roof, round_trip_ns, gflops):
    return {"name": name, "run_name": name, "run_type": "iteration",
            "step_gflop": 1.0, "step_gb": 0.5, "gflops": gflops,
            "of_adjacent_roofline": of_roof, "adjacent_read_gb_per_s": 34.0,
            "adjacent_sgemm_gflops": 200.0, "adjacent_round_trip_ns": round_trip_ns}


def median_aggregate(name, of_roof, gflops):
    entry = repetition(name, of_roof, 0, gflops)
    entry.update(run_type="aggregate", aggregate_name="median", name=name + "_median")
    del entry["adjacent_round_trip_ns"]
    return entry


def report():
    benchmarks = [
        # The decode step: two repetitions with the cores together, one apart.
        repetition(DECODE, 0.90, 70.0, 30.0),
        repetition(DECODE, 0.50, 350.0, 31.0),
        repetition(DECODE, 0.80, 80.0, 29.0),
        median_aggregate(DECODE, 0.80, 30.0),
        # The prefill ran apart every time.
        repetition(PREFILL, 0.70, 360.0, 150.0),
        repetition(PREFILL, 0.60, 340.0, 140.0),
        median_aggregate(PREFILL, 0.65, 145.0),
    ]
    return {"context": {"num_cpus": 2, "mhz_per_cpu": 3000, "date": "2026-11-30"},
            "benchmarks": benchmarks}


def run_chart(tmp_path, *extra, report_data=None):
    data = tmp_path / "engine_bench.json"
    data.write_text(json.dumps(report() if report_data is None else report_data))
    png = tmp_path / "roofline.png"
    result = subprocess.run([sys.executable, str(CHART), str(data), str(png), *extra],
                            capture_output=True, text=True, timeout=120)
    return result, png


def line_for(stdout, label):
    lines = [line for line in stdout.splitlines() if line.startswith(label + ":")]
    assert len(lines) == 1, stdout
    return lines[0]


def test_without_a_filter_the_median_aggregates_are_plotted(tmp_path):
    result, png = run_chart(tmp_path)
    assert result.returncode == 0, result.stderr
    assert png.stat().st_size > 0
    assert "80% of roof" in line_for(result.stdout, "decode, batch 1, bf16")
    assert "65% of roof" in line_for(result.stdout, "prefill 512 tokens, bf16")


def test_the_compute_roof_names_the_sgemm_kernels_it_was_measured_on(tmp_path):
    result, _ = run_chart(tmp_path)
    assert result.returncode == 0, result.stderr
    assert "OpenBLAS" not in line_for(result.stdout, "roofline")
    data = report()
    data["context"]["sgemm_kernels"] = "Haswell (OPENBLAS_CORETYPE=Haswell)"
    result, _ = run_chart(tmp_path, report_data=data)
    assert result.returncode == 0, result.stderr
    assert line_for(result.stdout, "roofline").endswith(
        "(OpenBLAS Haswell (OPENBLAS_CORETYPE=Haswell))")


def test_max_round_trip_keeps_only_the_repetitions_of_one_placement(tmp_path):
    result, png = run_chart(tmp_path, "--max-round-trip-ns", "200")
    assert result.returncode == 0, result.stderr
    assert png.stat().st_size > 0
    # The median of 0.90 and 0.80 (the repetition at 350 ns is left out).
    decode = line_for(result.stdout, "decode, batch 1, bf16")
    assert "85% of roof, 2 repetitions" in decode
    assert "29.5 GFLOP/s" in decode
    # Every prefill repetition ran apart: nothing of it is left to plot.
    assert "prefill" not in result.stdout


def test_max_round_trip_that_keeps_nothing_is_an_error(tmp_path):
    result, png = run_chart(tmp_path, "--max-round-trip-ns", "10")
    assert result.returncode != 0
    assert "no benchmark left to plot" in result.stderr
    assert not png.exists()


def cuda_step(name, gflops):
    """A CUDA run's entry: the device limits measured once (machine_*), no
    adjacent ones."""
    return {"name": name, "run_name": name, "run_type": "iteration", "step_gflop": 1.0,
            "step_gb": 0.5, "gflops": gflops, "machine_read_gb_per_s": 3000.0,
            "machine_sgemm_gflops": 600000.0}


def test_a_cuda_run_keeps_each_model_and_labels_its_16_bit_weights(tmp_path):
    """engine_bench --device=cuda runs switchall and the dense baseline with
    the same shapes: each keeps its own point, both labelled bf16 (the CUDA
    backend holds the weights in 16 bits)."""
    steps = [("decode/{}/batch:1/context:128/real_time", 30.0, 20.0),
             ("mixed/{}/decoding:30/prompts:2x32/context:128/real_time", 300.0, 200.0),
             ("prefill/{}/tokens:2048/real_time", 3000.0, 2000.0)]
    data = {"context": {"num_cpus": 16, "mhz_per_cpu": 3000, "date": "2026-12-05",
                        "device": "NVIDIA H100 80GB HBM3", "copy_gb_per_s": "3000.0",
                        "gemm_bf16_tflops": "600.0"},
            "benchmarks": [cuda_step(name.format(model), gflops)
                           for name, switchall, dense in steps
                           for model, gflops in (("switchall", switchall), ("dense", dense))]}
    result, png = run_chart(tmp_path, report_data=data)
    assert result.returncode == 0, result.stderr
    assert png.stat().st_size > 0
    assert "30.0 GFLOP/s" in line_for(result.stdout, "decode, batch 1, bf16")
    assert "20.0 GFLOP/s" in line_for(result.stdout, "decode, batch 1, dense, bf16")
    assert "300.0 GFLOP/s" in line_for(result.stdout,
                                       "mixed, 30 decoding + 2x32 prompt tokens, bf16")
    assert "200.0 GFLOP/s" in line_for(result.stdout,
                                       "mixed, 30 decoding + 2x32 prompt tokens, dense, bf16")
    assert "3000.0 GFLOP/s" in line_for(result.stdout, "prefill 2048 tokens, bf16")
    assert "2000.0 GFLOP/s" in line_for(result.stdout, "prefill 2048 tokens, dense, bf16")
    assert "f32" not in result.stdout
    assert len(result.stdout.splitlines()) == 7  # the roofline and six points
    assert line_for(result.stdout, "roofline") == \
        "roofline: copy 3000.0 GB/s, bf16 GEMM 600000.0 GFLOP/s"

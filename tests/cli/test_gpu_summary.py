"""bench/gpu_summary.py reads compare_pytorch.py's tables by their header:
with one reference dtype or several (--ref-dtypes f32,bf16), the engine and
gRPC columns are the engine's and gRPC's."""
import json
import pathlib
import subprocess
import sys

ROOT = pathlib.Path(__file__).resolve().parents[2]
SUMMARY = ROOT / "bench" / "gpu_summary.py"


def table(refs, rows):
    """compare_pytorch.py's section for reference dtypes `refs`; rows of
    (concurrency, [reference tokens/s per dtype], engine, gRPC)."""
    cell = lambda v: f"{v:.1f}" if v is not None else "—"  # noqa: E731
    ratio = lambda a, b: f"{a / b:.2f}x" if a and b else "—"  # noqa: E731
    lines = ["## paper-shaped: /tmp/paper", "device cuda, reference on cuda; ...", "",
             "| concurrency / batch | " + " | ".join(f"reference {d} tokens/s" for d in refs)
             + " | engine tokens/s | gRPC tokens/s | "
             + " | ".join(f"engine / reference {d}" for d in refs) + " | gRPC / engine |",
             "|" + " --- |" * (2 * len(refs) + 4)]
    for c, ref, eng, rpc in rows:
        lines.append(f"| {c} | " + " | ".join(cell(r) for r in ref)
                     + f" | {cell(eng)} | {cell(rpc)} | "
                     + " | ".join(ratio(eng, r) for r in ref) + f" | {ratio(rpc, eng)} |")
    return "\n".join(lines) + "\n"


def summarise(tmp_path, compare):
    engine_bench = tmp_path / "engine_bench.json"
    engine_bench.write_text(json.dumps({"context": {}, "benchmarks": []}))
    compare_txt = tmp_path / "compare_pytorch.txt"
    compare_txt.write_text(compare)
    result = subprocess.run([sys.executable, str(SUMMARY), "--engine-bench", str(engine_bench),
                             "--compare", str(compare_txt)], capture_output=True, text=True,
                            timeout=60)
    assert result.returncode == 0, result.stdout + result.stderr
    return [line for line in result.stdout.splitlines() if line.startswith("- ")], result.stdout


def test_one_reference_dtype(tmp_path):
    goals, out = summarise(tmp_path, table(["f32"], [(1, [40.0], 464.9, 455.0),
                                                     (32, [None], 5925.0, 5000.0)]))
    assert goals == [
        "- PASS: paper-shaped: >= 10x the PyTorch reference at batch 1 (11.6x)",
        "- FAIL: paper-shaped: gRPC >= 0.9x the in-process engine at 32 clients (0.84x)"], out
    assert "1 of 2 goals met" in out


def test_two_reference_dtypes(tmp_path):
    # Columns 2-4 are reference f32, reference bf16 and the engine: the
    # engine's ratio to each reference, and gRPC's to the engine, are the goals.
    goals, out = summarise(tmp_path, table(["f32", "bf16"], [(1, [3.5, 6.8], 464.9, 455.0),
                                                             (32, [None, None], 5925.0, 5611.0)]))
    assert goals == [
        "- PASS: paper-shaped: >= 10x the PyTorch reference f32 at batch 1 (132.8x)",
        "- PASS: paper-shaped: >= 10x the PyTorch reference bf16 at batch 1 (68.4x)",
        "- PASS: paper-shaped: gRPC >= 0.9x the in-process engine at 32 clients (0.95x)"], out
    assert "3 of 3 goals met" in out

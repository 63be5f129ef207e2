"""The offline command line against the Python reference's golden vectors.

`switchserve score --dump-logits` is how anyone outside the project checks the
engine: its logits must match the reference's for every golden model
(relative error <= 1e-4, f32 engine vs float64 reference). Only sequence 0 of
each golden step is scored, alone, so only dropless variants apply (with a
capacity limit a sequence's routing depends on the batch it ran in).
"""
import json
import os
import pathlib
import subprocess
import sys

import numpy as np
import pytest

ROOT = pathlib.Path(__file__).resolve().parents[2]
sys.path.insert(0, str(ROOT / "tools" / "reference"))
import safetensors_io  # noqa: E402

BINARY = os.environ["SWITCHSERVE_BINARY"]
GOLDEN = ROOT / "tests" / "golden"


def dropless_variants():
    names = []
    for d in sorted(GOLDEN.iterdir()):
        config = json.loads((d / "config.json").read_text())
        if config.get("dispatch", {}).get("capacity_factor", 0) <= 0:
            names.append(d.name)
    return names


def run(*args, check=True):
    result = subprocess.run([BINARY, *args], capture_output=True, text=True, timeout=120)
    if check:
        assert result.returncode == 0, result.stderr
    return result


def test_dropless_variants_exist():
    assert len(dropless_variants()) >= 10


@pytest.mark.parametrize("variant", dropless_variants())
def test_dump_logits_matches_reference(variant, tmp_path):
    golden = safetensors_io.load_file(str(GOLDEN / variant / "golden.safetensors"))
    n = int(golden["seq_lens"][0])
    tokens = golden["tokens"][:n].tolist()
    want = golden["logits"][:n].numpy()
    out = tmp_path / "logits.npy"
    result = run("score", "--model", str(GOLDEN / variant),
                 "--tokens", ",".join(map(str, tokens)), "--dump-logits", str(out))
    got = np.load(out)
    assert got.shape == want.shape
    assert np.abs(got - want).max() / np.abs(want).max() <= 1e-4

    # The printed mean NLL is the reference's, from the same logits.
    logp = want - np.log(np.exp(want - want.max(1, keepdims=True)).sum(1, keepdims=True)) \
        - want.max(1, keepdims=True)
    nll = -np.mean([logp[i, tokens[i + 1]] for i in range(n - 1)])
    printed = dict(line.split(": ", 1) for line in result.stdout.strip().splitlines())
    assert int(printed["tokens"]) == n
    assert float(printed["mean_nll"]) == pytest.approx(nll, rel=1e-4)


def test_score_text_windows_cover_every_token(tmp_path):
    text = tmp_path / "t.txt"
    text.write_bytes(b"In the beginning " * 20)  # 340 bytes > max_seq_len 64
    result = run("score", "--model", str(GOLDEN / "switchall_f16"), "--text", str(text))
    printed = dict(line.split(": ", 1) for line in result.stdout.strip().splitlines())
    assert int(printed["tokens"]) == 340
    assert int(printed["predicted"]) == 339
    assert float(printed["perplexity"]) > 1
    assert float(printed["bits_per_byte"]) > 0


def test_generate_is_deterministic():
    variant = GOLDEN / "switchhead_sigmoid"
    first = run("generate", "--model", str(variant), "--prompt", "abc", "--max-new-tokens", "8")
    second = run("generate", "--model", str(variant), "--prompt", "abc", "--max-new-tokens", "8")
    assert first.stdout == second.stdout
    assert first.stdout.startswith("abc")


def test_bad_input_is_reported_not_crashed(tmp_path):
    missing = run("score", "--model", str(tmp_path / "nope"), "--tokens", "1,2", check=False)
    assert missing.returncode == 1 and "not a model directory" in missing.stderr
    bad_tokens = run("score", "--model", str(GOLDEN / "dense_mha"), "--tokens", "1,x", check=False)
    assert bad_tokens.returncode == 1 and "--tokens" in bad_tokens.stderr
    out_of_vocab = run("score", "--model", str(GOLDEN / "dense_mha"), "--tokens", "1,999",
                       check=False)
    assert out_of_vocab.returncode == 1 and "999" in out_of_vocab.stderr
    no_prompt = run("generate", "--model", str(GOLDEN / "dense_mha"), check=False)
    assert no_prompt.returncode == 2

"""The offline command line against the Python reference's golden vectors.

`switchserve score --dump-logits` is how anyone outside the project checks the
engine: its logits must match the reference's for every golden model
(relative error <= 1e-4, f32 engine vs float64 reference). Only sequence 0 of
each golden step is scored, alone, so only variants whose results do not
depend on the batch apply: dropless, or capacity counted per sequence (under
the step capacity scope a sequence's routing depends on the batch it ran in).
"""
import json
import os
import pathlib
import re
import shutil
import subprocess
import sys

import numpy as np
import pytest

ROOT = pathlib.Path(__file__).resolve().parents[2]
sys.path.insert(0, str(ROOT / "tools" / "reference"))
import safetensors_io  # noqa: E402

BINARY = os.environ["SWITCHSERVE_BINARY"]
GOLDEN = ROOT / "tests" / "golden"


def batch_independent_variants():
    names = []
    for d in sorted(GOLDEN.iterdir()):
        dispatch = json.loads((d / "config.json").read_text()).get("dispatch", {})
        if dispatch.get("capacity_factor", 0) <= 0 or \
                dispatch.get("capacity_scope", "sequence") == "sequence":
            names.append(d.name)
    return names


def run(*args, check=True):
    result = subprocess.run([BINARY, *args], capture_output=True, text=True, timeout=120)
    if check:
        assert result.returncode == 0, result.stderr
    return result


def test_batch_independent_variants_exist():
    variants = batch_independent_variants()
    assert len(variants) >= 16
    assert "seq_switchall_drop_g8" in variants and "switchall_capacity" not in variants


@pytest.mark.parametrize("variant", batch_independent_variants())
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


@pytest.mark.parametrize("bos", [False, True], ids=["no_bos", "bos"])
def test_score_text_windows_cover_every_token_and_match_the_reference(tmp_path, bos):
    text = tmp_path / "t.txt"
    text.write_bytes(b"In the beginning " * 20)  # 340 bytes > max_seq_len 64
    model = GOLDEN / "switchall_f16"
    if bos:
        # The same weights with a BOS before the text: every byte is
        # predicted (the reference divided by one byte fewer).
        model = tmp_path / "bos"
        model.mkdir()
        config = json.loads((GOLDEN / "switchall_f16" / "config.json").read_text())
        (model / "config.json").write_text(json.dumps(dict(config, bos_token_id=1)))
        (model / "model.safetensors").symlink_to(GOLDEN / "switchall_f16" / "model.safetensors")
    result = run("score", "--model", str(model), "--text", str(text))
    printed = dict(line.split(": ", 1) for line in result.stdout.strip().splitlines())
    assert int(printed["tokens"]) == 340 + bos
    assert int(printed["predicted"]) == 339 + bos
    # The float64 PyTorch reference scores the same text with the same
    # windows (tools/score_reference.py): the same NLL, perplexity and bits
    # per byte (its JSON rounds to 4-6 decimals).
    reference_json = tmp_path / "reference.json"
    subprocess.run([sys.executable, str(ROOT / "tools" / "score_reference.py"), str(model),
                    str(text), "--dtype", "f64", "--json", str(reference_json)],
                   check=True, capture_output=True, timeout=300)
    reference = json.loads(reference_json.read_text())
    assert reference["predicted_tokens"] == 339 + bos
    assert float(printed["mean_nll"]) == pytest.approx(reference["mean_nll"], rel=1e-6)
    assert float(printed["perplexity"]) == pytest.approx(reference["perplexity"], rel=1e-4)
    assert float(printed["bits_per_byte"]) == pytest.approx(reference["bits_per_byte"], rel=1e-5)


def test_score_counts_whitespace_sentencepiece_drops_with_the_first_token(tmp_path):
    """A SentencePiece piece spans the whitespace normalisation removed before
    it: texts that differ only there score the same tokens, NLL and bits per
    byte, whose bytes are the file's after the first token's span."""
    model = tmp_path / "spm"
    model.mkdir()
    config = json.loads((GOLDEN / "switchall_f16" / "config.json").read_text())
    (model / "config.json").write_text(
        json.dumps(dict(config, vocab_size=300, tokenizer="sentencepiece")))
    tensors = safetensors_io.load_file(str(GOLDEN / "switchall_f16" / "model.safetensors"))
    embedding = tensors["embedding.weight"]  # tied: the output head too
    # 44 more rows for the tokenizer's 300 pieces
    tensors["embedding.weight"] = embedding.new_tensor(
        np.concatenate([embedding.numpy(), embedding.numpy()[:44][::-1]]))
    safetensors_io.save_file(tensors, str(model / "model.safetensors"))
    shutil.copy(ROOT / "tests" / "data" / "spm" / "tokenizer.model", model / "tokenizer.model")

    body = "The river runs to the sea"
    results = {}
    for lead in ["", " ", "   "]:
        text = tmp_path / f"lead{len(lead)}.txt"
        text.write_text(lead + body)
        results[lead] = scored(run("score", "--model", str(model), "--text", str(text)))
    plain = results[""]
    nll_sum = float(plain["mean_nll"]) * int(plain["predicted"])
    # The pieces are "▁T he ▁river ▁r un s ▁to ▁the ▁sea" (spm_encode): the
    # 24 bytes after "T" are predicted.
    assert int(plain["tokens"]) == 9
    assert float(plain["bits_per_byte"]) == pytest.approx(nll_sum / np.log(2) / 24, rel=1e-5)
    for lead, printed in results.items():
        assert printed["tokens"] == plain["tokens"], repr(lead)
        assert printed["mean_nll"] == plain["mean_nll"], repr(lead)
        assert printed["bits_per_byte"] == plain["bits_per_byte"], repr(lead)


@pytest.mark.parametrize("text", [b"", b"A"], ids=["empty", "one_byte"])
def test_reference_refuses_a_text_of_fewer_than_two_tokens(tmp_path, text):
    """As `switchserve score`: a clear error, not a ZeroDivisionError."""
    path = tmp_path / "t.txt"
    path.write_bytes(text)
    want = f"need at least 2 tokens, found {len(text)}"
    assert want in run("score", "--model", str(GOLDEN / "switchall_f16"), "--text", str(path),
                       check=False).stderr
    for args in ([str(GOLDEN / "switchall_f16"), str(path)], ["--unigram", str(path), str(path)]):
        result = subprocess.run([sys.executable, str(ROOT / "tools" / "score_reference.py"), *args,
                                 "--threads", "1"], capture_output=True, text=True, timeout=300)
        assert result.returncode == 1 and want in result.stderr, result.stderr


@pytest.mark.parametrize("model,config,max_new_tokens,room", [
    (ROOT / "models" / "default", {"bos_token_id": 10}, 24, None),
    (ROOT / "models" / "default", {"eos_token_id": ord(" ")}, 24, None),
    (GOLDEN / "switchall_f16", {}, 70, 53),  # 12-token prompt, max_seq_len 64
], ids=["bos", "eos", "context"])
def test_reference_generate_continues_as_generate(tmp_path, model, config, max_new_tokens, room):
    """tools/score_reference.py --generate prepends the BOS, stops at EOS and
    at the context as `switchserve generate` does: the same greedy
    continuation."""
    if config:
        base = json.loads((model / "config.json").read_text())
        (tmp_path / "config.json").write_text(json.dumps(dict(base, **config)))
        (tmp_path / "model.safetensors").symlink_to(model / "model.safetensors")
        model = tmp_path
    prompt = "And God said"
    engine = run("generate", "--model", str(model), "--prompt", prompt,
                 "--max-new-tokens", str(max_new_tokens), "--temperature", "0", "--threads", "1")
    reference = subprocess.run([sys.executable, str(ROOT / "tools" / "score_reference.py"),
                                str(model), "--generate", prompt,
                                "--max-new-tokens", str(max_new_tokens), "--threads", "1"],
                               capture_output=True, text=True, timeout=300)
    assert reference.returncode == 0, reference.stderr
    continuation = json.loads(reference.stdout)["continuation"]
    assert engine.stdout == prompt + continuation + "\n"
    if room is not None:
        assert len(continuation) == room
        assert f"leaves room for {room} of the {max_new_tokens}" in engine.stderr
        assert f"leaves room for {room} of the {max_new_tokens}" in reference.stderr
    elif "eos_token_id" in config:  # stopped early, the EOS not printed
        assert 0 < len(continuation) < max_new_tokens


def test_an_installed_binary_takes_the_model_installed_beside_it(tmp_path):
    """bin/switchserve with share/switchserve/models/default under the same
    prefix (the container images' layout) takes that as the built-in model:
    the default was only the source tree's path, which an image lacks, so
    `docker run IMAGE generate` failed with NOT_FOUND."""
    prefix = tmp_path / "prefix"
    (prefix / "bin").mkdir(parents=True)
    shutil.copy(BINARY, prefix / "bin" / "switchserve")
    model = GOLDEN / "switchall_f16"
    shutil.copytree(model, prefix / "share" / "switchserve" / "models" / "default")
    args = ["generate", "--prompt", "And God", "--max-new-tokens", "8", "--temperature", "0"]
    installed = subprocess.run([str(prefix / "bin" / "switchserve"), *args], capture_output=True,
                               text=True, timeout=120)
    assert installed.returncode == 0, installed.stderr
    assert installed.stdout == run(*args, "--model", str(model)).stdout
    assert installed.stdout != run(*args).stdout  # the source tree's built-in model


def test_generate_is_deterministic():
    variant = GOLDEN / "switchhead_sigmoid"
    first = run("generate", "--model", str(variant), "--prompt", "abc", "--max-new-tokens", "8")
    second = run("generate", "--model", str(variant), "--prompt", "abc", "--max-new-tokens", "8")
    assert first.stdout == second.stdout
    assert first.stdout.startswith("abc")


def test_generate_takes_the_servers_penalties_and_ranges():
    """generate's min-p and penalty flags change a greedy text that repeats
    itself, and values outside the server's ranges are refused (exit 2,
    naming the flag)."""
    args = ["generate", "--prompt", "the the the", "--max-new-tokens", "24"]
    plain = run(*args).stdout
    for flag, value in [("--repetition-penalty", "1.5"), ("--presence-penalty", "2"),
                        ("--frequency-penalty", "2")]:
        assert run(*args, flag, value).stdout != plain, flag
        assert run(*args, flag, value).stdout == run(*args, flag, value).stdout, flag
    assert run(*args, "--min-p", "0.5").stdout == plain  # greedy keeps the top token
    for flag, value in [("--min-p", "1.5"), ("--repetition-penalty", "0"),
                        ("--presence-penalty", "3"), ("--frequency-penalty", "-2.5")]:
        refused = run(*args, flag, value, check=False)
        assert refused.returncode == 2 and flag in refused.stderr, (flag, refused.stderr)


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
    bad_scope = run("score", "--model", str(GOLDEN / "dense_mha"), "--tokens", "1,2",
                    "--capacity-scope", "batch", check=False)
    assert bad_scope.returncode == 1 and "--capacity-scope" in bad_scope.stderr
    # switchall_capacity's dispatch is the step scope: a group makes no sense there.
    group_for_step = run("score", "--model", str(GOLDEN / "switchall_capacity"), "--tokens",
                         "1,2", "--capacity-group", "8", check=False)
    assert group_for_step.returncode == 1 and "--capacity-group" in group_for_step.stderr


def test_score_applies_the_dispatch_flags(tmp_path):
    # The sequence-scope golden scored with its own dispatch drops
    # assignments; dropless, nothing; the flags change what score computes.
    tokens = ",".join(str(32 + (i * 37) % 90) for i in range(48))
    model = str(GOLDEN / "seq_switchall_drop_g8")
    own = dict(line.split(": ", 1) for line in
               run("score", "--model", model, "--tokens", tokens).stdout.splitlines())
    dropless = dict(line.split(": ", 1) for line in
                    run("score", "--model", model, "--tokens", tokens,
                        "--capacity-factor", "0").stdout.splitlines())
    assert float(own["dropped_ffn"]) > 0 and float(dropless["dropped_ffn"]) == 0
    assert own["mean_nll"] != dropless["mean_nll"]
    rerouted = dict(line.split(": ", 1) for line in
                    run("score", "--model", model, "--tokens", tokens,
                        "--overflow", "reroute").stdout.splitlines())
    assert float(rerouted["rerouted_attn_v"]) > 0


DEFAULT_MODEL = ROOT / "models" / "default"


def generated_bytes(result, prompt):
    assert result.stdout.endswith("\n")
    text = result.stdout[:-1].encode()
    assert text.startswith(prompt.encode())
    return text[len(prompt):]


def model_variant(tmp_path, name, **config_changes):
    """The built-in model with some config.json keys changed (same weights)."""
    model = tmp_path / name
    model.mkdir()
    config = json.loads((DEFAULT_MODEL / "config.json").read_text())
    config.update(config_changes)
    (model / "config.json").write_text(json.dumps(config))
    (model / "model.safetensors").symlink_to(DEFAULT_MODEL / "model.safetensors")
    return model, config


@pytest.mark.parametrize("dispatch", [
    {"capacity_factor": 0},
    {"capacity_factor": 1.0, "min_capacity": 0, "overflow": "drop", "capacity_scope": "sequence",
     "capacity_group": 16},
], ids=["dropless", "sequence_g16_drop"])
def test_greedy_generate_picks_the_most_likely_token_at_every_step(tmp_path, dispatch):
    # generate runs the serving engine (scheduler, backend sampling) one token
    # per step; score runs the sequence runner over the whole text at once.
    # Dropless or with capacity counted per sequence, the routing does not
    # depend on the steps: greedy generation must pick the argmax of score's
    # logits at every generated position.
    model, _ = model_variant(tmp_path, "variant", dispatch=dispatch)
    for prompt in ["In the beginning", "And God said"]:
        result = run("generate", "--model", str(model), "--prompt", prompt,
                     "--max-new-tokens", "24")
        new = generated_bytes(result, prompt)
        assert len(new) == 24 and max(new) < 128  # byte tokenizer, ASCII output
        tokens = list(prompt.encode() + new)
        out = tmp_path / "logits.npy"
        run("score", "--model", str(model), "--tokens", ",".join(map(str, tokens)),
            "--dump-logits", str(out))
        logits = np.load(out)
        for i in range(len(prompt) - 1, len(tokens) - 1):
            assert int(np.argmax(logits[i])) == tokens[i + 1], f"{prompt!r}: position {i}"


def test_generate_ends_at_eos_and_at_the_context(tmp_path):
    prompt = "In the beginning"
    plain = generated_bytes(run("generate", "--model", str(DEFAULT_MODEL), "--prompt", prompt,
                                "--max-new-tokens", "40"), prompt)
    assert b" " in plain
    # The same model with the space as its EOS token: generation ends before it.
    model, config = model_variant(tmp_path, "eos-space", eos_token_id=ord(" "))
    stopped = generated_bytes(run("generate", "--model", str(model), "--prompt", prompt,
                                  "--max-new-tokens", "40"), prompt)
    assert stopped == plain[:plain.index(b" ")]

    # A prompt one token short of the context: the token predicted from the
    # last position is generated too, then generation ends.
    context = config["max_seq_len"]
    long_prompt = ("And God said, Let there be light. " * 10)[:context - 1]
    result = run("generate", "--model", str(DEFAULT_MODEL), "--prompt", long_prompt,
                 "--max-new-tokens", "10")
    near_end = generated_bytes(result, long_prompt)
    assert len(near_end) == 2
    # ... and says so (it was silent).
    assert f"the context ({context} tokens) leaves room for 2 of the 10 new tokens" in result.stderr
    # A prompt longer than the context leaves nothing to generate: refused.
    over = run("generate", "--model", str(DEFAULT_MODEL), "--prompt", "a" * (context + 1),
               check=False)
    assert over.returncode == 1 and over.stdout == ""
    assert f"more than the context ({context})" in over.stderr


SERVER = ROOT / "server"
# The sources whose flags each subcommand reads: ABSL_FLAG definitions and
# ABSL_DECLARE_FLAG declarations.
COMMAND_FLAG_SOURCES = {
    "serve": ["server_flags.cc", "common_flags.h", "dispatch_flags.h"],
    "generate": ["generate_command.cc", "common_flags.h", "dispatch_flags.h"],
    "score": ["score_command.cc", "common_flags.h", "dispatch_flags.h"],
    "health": ["health_command.cc"],
}
_DEFINED = re.compile(r"ABSL_FLAG\(\s*[^,]+?\s*,\s*(\w+)\s*,\s*(.+?)\s*,\s*\"", re.S)
_DECLARED = re.compile(r"ABSL_DECLARE_FLAG\(\s*[^,]+?\s*,\s*(\w+)\s*\)")


def flag_defaults():
    """Flag name -> default expression, from every ABSL_FLAG under server/."""
    defaults = {}
    for path in SERVER.rglob("*.cc"):
        defaults.update(dict(_DEFINED.findall(path.read_text())))
    return defaults


def test_version_names_the_release_the_revision_and_the_backends():
    result = run("--version")
    assert run("version").stdout == result.stdout
    assert "`switchserve --version`" in run("help").stdout
    first, second = result.stdout.splitlines()
    release = re.search(r"project\(switchserve VERSION (\S+) ",
                        (ROOT / "CMakeLists.txt").read_text()).group(1)
    match = re.fullmatch(r"switchserve (\S+) \(revision (\S+)\)", first)
    assert match and match.group(1) == release, first
    revision = match.group(2)
    if shutil.which("git") and (ROOT / ".git").exists():
        # A commit of this checkout (built from it, perhaps before a later one).
        assert re.fullmatch(r"[0-9a-f]{12}(-dirty)?", revision), revision
        known = subprocess.run(["git", "-C", str(ROOT), "cat-file", "-e",
                                revision.removesuffix("-dirty") + "^{commit}"])
        assert known.returncode == 0, revision
    else:
        assert revision == "unknown"
    backends = second.removeprefix("backends: ").split(", ")
    assert second.startswith("backends: ") and "cpu" in backends
    # "cuda (emulated)": a build whose CUDA backend runs on the SIMT executor
    # (the sanitizer builds, without nvcc).
    assert set(backends) <= {"cpu", "cuda", "cuda (emulated)"}, backends
    assert len(set(backends)) == len(backends) and not {"cuda", "cuda (emulated)"} <= set(backends)


def listed_defaults(help_text):
    """--flag-name -> printed default, from `switchserve COMMAND --help`."""
    return dict(re.findall(r"^  --([\w-]+) \(default: (.*)\)$", help_text, re.M))


@pytest.mark.parametrize("command", sorted(COMMAND_FLAG_SOURCES))
def test_subcommand_help_lists_its_flags_with_defaults(command):
    result = run(command, "--help")
    assert "No flags matched" not in result.stdout + result.stderr
    assert result.stdout.startswith(f"usage: switchserve {command}")
    listed = listed_defaults(result.stdout)
    defaults = flag_defaults()
    expected = set()
    for source in COMMAND_FLAG_SOURCES[command]:
        text = (SERVER / source).read_text()
        expected |= {name for name, _ in _DEFINED.findall(text)} | set(_DECLARED.findall(text))
    assert len(expected) >= 6
    for name in sorted(expected):
        spelled = name.replace("_", "-")
        assert spelled in listed, f"{command} --help does not list --{spelled}"
        default, shown = defaults[name], listed[spelled]
        if default.startswith('"'):
            assert shown == default, spelled
        elif default == "std::nullopt":
            assert shown == "unset", spelled
        elif default in ("true", "false"):
            assert shown == default, spelled
        else:
            assert float(shown) == float(default), spelled
    # Nothing else: the flags of other subcommands stay out.
    assert set(listed) == {name.replace("_", "-") for name in expected}


def scored(result):
    return dict(line.split(": ", 1) for line in result.stdout.strip().splitlines())


def test_weights_held_as_stored_give_the_f32_logits_bitwise(tmp_path):
    # The built-in model stores f16: held as stored, the kernels widen in
    # registers what --weights-dtype f32 widens at load; widening is exact and
    # the operation order is the same, so every logit is the same bits.
    tokens = ",".join(str(b) for b in (ROOT / "models" / "heldout.txt").read_bytes()[:200])
    logits = {}
    for dtype in ("auto", "f32", "f16"):
        out = tmp_path / f"{dtype}.npy"
        run("score", "--weights-dtype", dtype, "--tokens", tokens, "--dump-logits", str(out))
        logits[dtype] = np.load(out)
    for dtype in ("auto", "f16"):
        assert logits[dtype].shape == logits["f32"].shape
        assert np.array_equal(logits[dtype].view(np.uint32), logits["f32"].view(np.uint32)), dtype


def bf16_against_f32(tmp_path, flag):
    """score with `flag` f32 and bf16 on the first 2000 held-out bytes, in
    windows of 200 (the model's context is 256): the pooled relative RMS of
    the logits, the 95th percentile of each position's, and both bits per
    byte of the first 16 KiB."""
    heldout = (ROOT / "models" / "heldout.txt").read_bytes()
    sum_diff2 = sum_ref2 = 0.0
    per_row = []
    for start in range(0, 2000, 200):
        tokens = ",".join(str(b) for b in heldout[start:start + 200])
        logits = {}
        for dtype in ("f32", "bf16"):
            out = tmp_path / f"{dtype}.npy"
            run("score", flag, dtype, "--tokens", tokens, "--dump-logits", str(out))
            logits[dtype] = np.load(out).astype(np.float64)
        diff = logits["bf16"] - logits["f32"]
        sum_diff2 += np.sum(diff ** 2)
        sum_ref2 += np.sum(logits["f32"] ** 2)
        per_row += list(np.sqrt(np.mean(diff ** 2, axis=1) / np.mean(logits["f32"] ** 2, axis=1)))
    text = tmp_path / "heldout.txt"
    text.write_bytes(heldout[:16384])
    bpb = {dtype: float(scored(run("score", flag, dtype, "--text", str(text)))["bits_per_byte"])
           for dtype in ("f32", "bf16")}
    return np.sqrt(sum_diff2 / sum_ref2), np.percentile(per_row, 95), bpb


def test_bf16_weights_stay_close_to_f32(tmp_path):
    # bf16 rounds the f16 weights: not bitwise, but close. A few positions
    # (20 of 2000, measured) pick another expert in some router's top-k and
    # differ by 2-11%; they dominate the pooled figure (4.4e-3 measured; the
    # first window alone, 1.05e-2).
    rel_rms, p95, bpb = bf16_against_f32(tmp_path, "--weights-dtype")
    assert 0 < rel_rms <= 1e-2
    assert p95 <= 1e-2
    assert abs(bpb["bf16"] / bpb["f32"] - 1) <= 0.005


def test_bf16_kv_cache_stays_close_to_f32(tmp_path):
    # Keys and values rounded to bf16 as they are cached: the same bounds as
    # bf16 weights (the first window alone measured 1.05e-2 here too: a few
    # positions whose routing flips).
    rel_rms, p95, bpb = bf16_against_f32(tmp_path, "--kv-cache-dtype")
    assert 0 < rel_rms <= 1e-2
    assert p95 <= 1e-2
    assert abs(bpb["bf16"] / bpb["f32"] - 1) <= 0.005


def test_bad_kv_cache_dtype_names_the_flag():
    result = run("score", "--kv-cache-dtype", "fp8", "--tokens", "1,2", check=False)
    assert result.returncode == 1
    assert "--kv-cache-dtype" in result.stderr and "expected auto, f32 or bf16" in result.stderr


def test_bad_weights_dtype_names_the_flag():
    result = run("score", "--weights-dtype", "fp8", "--tokens", "1,2", check=False)
    assert result.returncode == 1
    assert "--weights-dtype" in result.stderr and "expected auto, f32, bf16 or f16" in result.stderr


def test_max_model_len_past_the_models_context_is_refused_naming_the_flag():
    for value, message in (("1000", "--max-model-len 1000 exceeds the model's context length 256"),
                           ("1", "--max-model-len: must be 0 (the model's context) or at least 2, "
                                 "found 1")):
        result = run("score", "--max-model-len", value, "--tokens", "1,2", check=False)
        assert result.returncode == 1
        assert message in result.stderr, result.stderr


def test_every_serve_flag_is_in_the_readme_flag_table():
    readme = (ROOT / "README.md").read_text()
    documented = set()
    for row in re.findall(r"^\| (`--[^|]+)\|", readme, re.M):
        documented |= set(re.findall(r"`--([\w-]+)`", row))
    listed = set(listed_defaults(run("serve", "--help").stdout))
    assert len(listed) >= 20
    assert listed - documented == set(), "serve flags missing from README's flag table"


@pytest.mark.parametrize("config_name, extra, expected", [
    ("", [], "unnamed-dir"),                                   # the directory's name
    ("kjv", [], "kjv"),                                        # config.json's name
    ("kjv", ["--served-model-name", "served-x"], "served-x"),  # the flag
])
def test_startup_log_names_the_model_as_it_is_served(tmp_path, config_name, extra, expected):
    """The startup log's `model NAME (DIR)` line gives the name clients use
    (the HTTP API's `model`, GetModelInfo's `name`), not an "(unnamed)"."""
    from server_process import ServerProcess
    model = tmp_path / "unnamed-dir"
    shutil.copytree(GOLDEN / "switchall_f16", model)
    config = json.loads((model / "config.json").read_text())
    config["name"] = config_name
    (model / "config.json").write_text(json.dumps(config))
    server = ServerProcess(BINARY, model, *extra)
    try:
        log = server.log()
    finally:
        server.close()
    assert re.search(rf"switchserve: model {re.escape(expected)} \({re.escape(str(model))}\): ", log), log

"""`switchserve serve --device cuda` end to end.

With the binary whose CUDA backend runs on the SIMT executor
(SWITCHSERVE_BINARY, built for tests only): a gRPC Generate served by the
CUDA backend, its model info and Prometheus metrics, against the same request
on `--device cpu`. The CUDA backend keeps this model's f16 weights as f16 and
its KV cache in bf16, so greedy tokens are compared while the CPU's top two
candidates are clearly apart (a near tie may go either way), and logprobs to
1e-2. A --kv-block-size the device cannot run is refused at startup.

With the GPU binary (SWITCHSERVE_GPU_BINARY, only where nvcc built one):
`--device cuda` on a machine without a usable GPU exits at once with a clear
message instead of serving.
"""

import json
import os
import re
import shutil
import subprocess
import tempfile

import grpc
import numpy as np
import pytest

import generation_pb2 as pb
import generation_pb2_grpc as pb_grpc
from server_process import ServerProcess, free_port

SOURCE_DIR = os.environ["SWITCHSERVE_SOURCE_DIR"]
MODEL = os.path.join(SOURCE_DIR, "tests/golden/switchall_f16")
# Top-two logprob gap below which the two devices may pick differently.
NEAR_TIE = 0.05


class Server(ServerProcess):
    def __init__(self, binary, *extra_args):
        super().__init__(binary, MODEL, *extra_args, metrics_port=free_port(),
                         prefix="switchserve_cuda_")

    def metrics(self, text=None):
        """The counters of a scrape (`text`, or a new one): {(name, labels): value}."""
        values = {}
        for line in (self.scrape_metrics() if text is None else text).splitlines():
            match = re.match(r"^(switchserve_moe_\w+)(\{[^}]*\})? (\S+)$", line)
            if match:
                values[(match.group(1), match.group(2) or "")] = float(match.group(3))
        return values


def request(text, max_new_tokens):
    r = pb.GenerateRequest(
        text=text, sampling=pb.SamplingParams(max_new_tokens=max_new_tokens, temperature=0.0))
    r.logprobs = 2
    r.return_routing = True
    return r


def total(metrics, name):
    return sum(v for (n, _), v in metrics.items() if n == name)


def test_version_names_the_cuda_backend_on_the_executor_as_emulated():
    out = subprocess.run([os.environ["SWITCHSERVE_BINARY"], "--version"], capture_output=True,
                         text=True, timeout=30, check=True).stdout
    assert out.splitlines()[1] == "backends: cuda (emulated), cpu", out


def test_serve_device_cuda_on_the_executor_matches_cpu():
    cuda = Server(os.environ["SWITCHSERVE_BINARY"], "--device", "cuda")
    cpu = Server(os.environ["SWITCHSERVE_BINARY"], "--device", "cpu")
    try:
        assert "backend cuda (emulated)" in cuda.log()
        with grpc.insecure_channel(cuda.address) as c, grpc.insecure_channel(cpu.address) as p:
            cuda_stub, cpu_stub = pb_grpc.GenerationStub(c), pb_grpc.GenerationStub(p)
            info = cuda_stub.GetModelInfo(pb.GetModelInfoRequest(), timeout=60)
            assert info.device == "cuda (emulated)"
            assert cpu_stub.GetModelInfo(pb.GetModelInfoRequest(), timeout=60).device == "cpu"
            before_cuda, before_cpu = cuda.metrics(), cpu.metrics()
            prompt = "The experts say"
            got = cuda_stub.Generate(request(prompt, 12), timeout=300)
            want = cpu_stub.Generate(request(prompt, 12), timeout=60)
        # A request's last step may reach the metrics just after its response:
        # each server's, once its steps have computed the prompt and every
        # token but the last (the warm-up is in no metric).
        def after(server, response):
            return server.metrics(server.scrape_metrics_after_steps(
                response.usage.prompt_tokens + response.usage.completion_tokens - 1))
        after_cuda, after_cpu = after(cuda, got), after(cpu, want)
    finally:
        cuda.close()
        cpu.close()

    assert got.usage.prompt_tokens == want.usage.prompt_tokens == len(prompt)
    assert len(got.token_ids) == 12
    compared = 0
    for g, w in zip(got.tokens, want.tokens):
        assert g.token_id == w.token_id, f"token {compared}"
        assert abs(g.logprob - w.logprob) < 1e-2
        assert len(g.top_logprobs) == 2
        assert len(g.routing.routers) == len(w.routing.routers) > 0
        compared += 1
        if w.top_logprobs[0].logprob - w.top_logprobs[1].logprob < NEAR_TIE:
            break  # the sequences may part here
    assert compared >= 3

    # The device's routing statistics reach the metrics: every token the
    # server computed (prompt and generated, one pass each) was routed by
    # every router, k assignments each, as on the CPU.
    def rise(after, before, name):
        return total(after, name) - total(before, name)

    tokens = rise(after_cuda, before_cuda, "switchserve_moe_router_tokens_total")
    assert tokens > 0
    assert tokens == rise(after_cpu, before_cpu, "switchserve_moe_router_tokens_total")
    assert rise(after_cuda, before_cuda, "switchserve_moe_assignments_total") == rise(
        after_cpu, before_cpu, "switchserve_moe_assignments_total") > 0


def logprobs_of(logits, tokens, first):
    """The sampler's logprob of tokens[i] from the logits row before it, for
    i >= first, as the engine computes it: (x - max) - log(sum exp(x - max)),
    the shifted values in f32, the sum in f64, its log rounded to f32."""
    out = []
    for i in range(first, len(tokens)):
        row = logits[i - 1]
        shifted = row - row.max()
        log_sum = np.float32(np.log(np.exp(shifted.astype(np.float64)).sum()))
        out.append(np.float32(shifted[tokens[i]] - log_sum))
    return out


def test_score_reproduces_the_bits_of_a_server_at_its_kv_block_size_on_the_executor():
    # The CUDA backend's attention takes keys a block at a time, so its
    # logits depend on --kv-block-size: `score` given the server's size
    # computes the same bits as the server's generated tokens.
    binary = os.environ["SWITCHSERVE_BINARY"]
    prompt = [84, 104, 101, 32, 101, 120, 112, 101, 114, 116, 115]
    cuda = Server(binary, "--device", "cuda", "--kv-block-size", "4")
    try:
        with grpc.insecure_channel(cuda.address) as channel:
            r = pb.GenerateRequest(sampling=pb.SamplingParams(max_new_tokens=8, temperature=0.0))
            r.token_ids.ids.extend(prompt)
            r.logprobs = 1
            got = pb_grpc.GenerationStub(channel).Generate(r, timeout=300)
    finally:
        cuda.close()
    tokens = prompt + list(got.token_ids)
    with tempfile.TemporaryDirectory() as tmp:
        dump = os.path.join(tmp, "logits.npy")
        subprocess.run([binary, "score", "--model", MODEL, "--device", "cuda", "--kv-block-size",
                        "4", "--tokens", ",".join(map(str, tokens)), "--dump-logits", dump],
                       check=True, capture_output=True, timeout=300)
        logits = np.load(dump)
    assert logits.shape[0] == len(tokens)
    want = logprobs_of(logits, tokens, len(prompt))
    assert [np.float32(t.logprob).tobytes() for t in got.tokens] == [w.tobytes() for w in want]


def test_a_kv_block_size_past_the_shared_memory_ends_serve_at_startup_on_the_executor():
    """The CUDA attention holds a whole KV block in shared memory: a
    --kv-block-size that needs more than the device's opt-in limit (the
    executor's is an H100's, 232,448 bytes) ends `serve --device cuda` at
    startup with the reason instead of failing every step. For the built-in
    model 892 fits and 893 needs 232,452 bytes."""
    binary = os.environ["SWITCHSERVE_BINARY"]
    process = subprocess.run(
        [binary, "serve", "--model", os.path.join(SOURCE_DIR, "models/default"), "--host",
         "127.0.0.1", "--port", "0", "--metrics-port", "0", "--device", "cuda",
         "--kv-block-size", "893"],
        capture_output=True, text=True, timeout=120)
    assert process.returncode == 1, process.stderr
    assert ("INVALID_ARGUMENT: --kv-block-size 893: the CUDA backend's attention over a KV block"
            " of 893 tokens needs 232452 bytes") in process.stderr, process.stderr
    assert "the largest block size that fits this model is 892" in process.stderr, process.stderr
    assert "--kv-cache-bytes" not in process.stderr, process.stderr


def test_a_weight_past_bf16s_range_needs_allow_non_finite_weights_on_the_executor(tmp_path):
    """An f32 weight beyond bf16's range (3.4e38) becomes infinite in the CUDA
    backend's 16-bit matrices: `generate` and `serve --device cuda` refuse the
    model naming the tensor and --allow-non-finite-weights, and with that
    flag run it, with a warning naming the tensor, as the loader does with
    non-finite weights."""
    binary = os.environ["SWITCHSERVE_BINARY"]
    source = os.path.join(SOURCE_DIR, "tests/golden/dense_mha")
    with open(os.path.join(source, "model.safetensors"), "rb") as f:
        data = bytearray(f.read())
    header_size = int.from_bytes(data[:8], "little")
    header = json.loads(data[8:8 + header_size])
    assert header["layers.1.ffn.w2.weight"]["dtype"] == "F32"
    start = 8 + header_size + header["layers.1.ffn.w2.weight"]["data_offsets"][0]
    data[start + 7 * 4:start + 8 * 4] = np.float32(3.4e38).tobytes()
    (tmp_path / "model.safetensors").write_bytes(bytes(data))
    shutil.copy(os.path.join(source, "config.json"), tmp_path / "config.json")
    generate = [binary, "generate", "--model", str(tmp_path), "--device", "cuda", "--prompt", "ab",
                "--max-new-tokens", "2"]

    refused = subprocess.run(generate, capture_output=True, text=True, timeout=300)
    assert refused.returncode != 0, refused.stderr
    assert "tensor layers.1.ffn.w2.weight holds non-finite values (element 7 " in refused.stderr
    assert "--allow-non-finite-weights loads it anyway" in refused.stderr, refused.stderr
    warning = "warning: tensor layers.1.ffn.w2.weight holds non-finite values (element 7 "
    allowed = subprocess.run(generate + ["--allow-non-finite-weights"], capture_output=True,
                             text=True, timeout=300)
    assert allowed.returncode == 0, allowed.stderr
    assert warning in allowed.stderr, allowed.stderr

    with pytest.raises(RuntimeError, match="--allow-non-finite-weights loads it anyway"):
        ServerProcess(binary, tmp_path, "--device", "cuda", prefix="switchserve_cuda_")
    server = ServerProcess(binary, tmp_path, "--device", "cuda", "--allow-non-finite-weights",
                           prefix="switchserve_cuda_")
    try:
        assert warning in server.log(), server.log()
    finally:
        server.close()


def test_gpu_binary_refuses_device_cuda_without_a_gpu():
    binary = os.environ["SWITCHSERVE_GPU_BINARY"]
    has_gpu = os.path.exists("/dev/nvidia0")
    process = subprocess.Popen(
        [binary, "serve", "--model", MODEL, "--host", "127.0.0.1", "--port", "0",
         "--metrics-port", "0", "--device", "cuda"],
        stdout=subprocess.PIPE, stderr=subprocess.STDOUT, text=True)
    try:
        output, _ = process.communicate(timeout=60 if not has_gpu else 5)
    except subprocess.TimeoutExpired:
        process.kill()
        output, _ = process.communicate()
        assert has_gpu, "--device cuda without a GPU should exit, not serve:\n" + output
        assert "backend cuda," in output
        return
    assert process.returncode not in (0, None) and process.returncode > 0, output
    assert "--device cuda" in output and "CUDA" in output, output
    assert "no usable CUDA device" in output or "no CUDA device" in output, output


def test_weights_dtype_f32_is_the_cuda_backends_f32_mode_on_the_executor():
    """`--weights-dtype f32` holds the CUDA backend's matrices in f32 (its
    parity mode, with an f32 KV cache) instead of 16 bits: its logprobs then
    match the CPU's f32 path to float rounding, and `--kv-cache-dtype f32`
    is accepted with it."""
    binary = os.environ["SWITCHSERVE_BINARY"]
    cuda = Server(binary, "--device", "cuda", "--weights-dtype", "f32", "--kv-cache-dtype", "f32")
    cpu = Server(binary, "--device", "cpu", "--weights-dtype", "f32", "--kv-cache-dtype", "f32")
    try:
        assert re.search(r"bytes per token, f32;", cuda.log()), cuda.log()
        with grpc.insecure_channel(cuda.address) as c, grpc.insecure_channel(cpu.address) as p:
            prompt = "The experts say"
            got = pb_grpc.GenerationStub(c).Generate(request(prompt, 6), timeout=300)
            want = pb_grpc.GenerationStub(p).Generate(request(prompt, 6), timeout=60)
    finally:
        cuda.close()
        cpu.close()
    assert list(got.token_ids) == list(want.token_ids)
    for g, w in zip(got.tokens, want.tokens):
        assert abs(g.logprob - w.logprob) < 1e-4
        for gt, wt in zip(g.top_logprobs, w.top_logprobs):
            assert gt.token_id == wt.token_id and abs(gt.logprob - wt.logprob) < 1e-4

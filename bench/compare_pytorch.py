#!/usr/bin/python3
"""switchserve vs what users would otherwise run: the PyTorch reference.

Same model, same prompt (token ids), same number of generated tokens, greedy,
EOS ignored, for everyone:

  (a) reference eager `Model.generate`, batch 1
  (b) reference with static padded batches (default 8 and 32)
  (c) switchserve engine in-process  (switchserve-bench --engine-model)
  (d) switchserve over gRPC          (switchserve serve + switchserve-bench --address)

at each concurrency (default 1, 8, 32), and the ratios engine/reference and
gRPC/reference. The reference runs with torch.set_num_threads(all cores), in
each dtype of --ref-dtypes (default f32; `f32,bf16` adds PyTorch's bfloat16
CPU path, its best setting where the CPU has bf16 instructions; torch.compile
is used with --ref-compile when the installed torch has it). tokens/s =
generated tokens / wall time, prefill included, for everyone.

--device cuda runs all of them on the GPU: the reference moved to CUDA in
bfloat16 (--ref-dtypes), switchserve with --device cuda (its 16-bit weights);
--build-dir then names a build with the CUDA backend (bench/gpu_suite.sh).

Also scores a held-out text (default models/heldout.txt, when present) with
`switchserve score` and with the reference (tools/score_reference.py when the
tree has it, else the same windowing here: windows of max_seq_len tokens
overlapping by one token) and prints both perplexities.

  /usr/bin/python3 bench/compare_pytorch.py [--model DIR] [--paper]
      [--prompt-len 16] [--new-tokens 32] [--concurrency 1,8,32] [--device cpu|cuda]

--paper adds the paper-shaped model (d 1024, 18 layers, SwitchHead H 4 E 4
k 2 dh 112 sigmoid, MoE FFN 32 experts of d_ff 128, sigmoid, k 4, vocab 8000)
with random weights, written once (--paper-dtype: f32, ~1 GB, or bf16) to
--paper-dir (default: one folder per dtype); switchserve holds them as stored.
"""
import argparse
import ctypes
import json
import math
import os
import random
import re
import socket
import subprocess
import sys
import tempfile
import time
import urllib.request

ROOT = os.path.dirname(os.path.dirname(os.path.abspath(__file__)))


def openblas_coretype_for_this_cpu(build_dir, env):
    """The core OPENBLAS_CORETYPE should name here, as `engine_bench
    --openblas-core` decides it (bench/roofline.h) run in `env` (without the
    variable), or None where OpenBLAS's own detection picks this CPU's
    widest kernels (or engine_bench is not built)."""
    try:
        out = subprocess.run([os.path.join(build_dir, "bench", "engine_bench"), "--openblas-core"],
                             env=env, check=True, capture_output=True, text=True).stdout
    except (OSError, subprocess.CalledProcessError):
        return None
    return out.strip() or None


# The reference at its best: its f32 products run on OpenBLAS, on the widest
# kernels this CPU runs. OpenBLAS picks those itself, except where an
# inherited OPENBLAS_CORETYPE names an older core (some environments set
# Haswell: 1.7x slower on an AMD EPYC (Zen 5) VM) or where the CPU is newer
# than the library (Debian 12's OpenBLAS runs its Prescott kernels on Intel's
# Emerald Rapids). OpenBLAS reads the variable when it loads, so the script
# starts again with the core engine_bench names (or without the variable),
# unless --keep-openblas-coretype.
_early = argparse.ArgumentParser(add_help=False)
_early.add_argument("--build-dir", default=os.path.join(ROOT, "build", "release"))
_early.add_argument("--keep-openblas-coretype", action="store_true")
_early = _early.parse_known_args()[0]
if not _early.keep_openblas_coretype:
    _env = {k: v for k, v in os.environ.items() if k != "OPENBLAS_CORETYPE"}
    _core = openblas_coretype_for_this_cpu(_early.build_dir, _env)
    if os.environ.get("OPENBLAS_CORETYPE") != _core:
        print(f"compare_pytorch: starting again with "
              f"{'OPENBLAS_CORETYPE=' + _core if _core else 'no OPENBLAS_CORETYPE'} "
              f"(was {os.environ.get('OPENBLAS_CORETYPE', 'unset')}), so that OpenBLAS runs "
              "this CPU's widest kernels (--keep-openblas-coretype keeps the environment's)",
              file=sys.stderr, flush=True)
        if _core:
            _env["OPENBLAS_CORETYPE"] = _core
        os.execve(sys.executable, [sys.executable, *sys.argv], _env)

import torch  # noqa: E402
sys.path.insert(0, os.path.join(ROOT, "tools", "reference"))
sys.path.insert(0, os.path.join(ROOT, "tools"))
from export import init_random, load_model, save_model  # noqa: E402
from reference_model import Model  # noqa: E402

PAPER_CONFIG = {
    "format_version": 1, "name": "paper_shaped_random", "vocab_size": 8000, "d_model": 1024,
    "n_layers": 18, "max_seq_len": 256, "norm": "layernorm", "tie_embeddings": True,
    "tokenizer": "byte",
    "attention": {"type": "switchhead", "n_heads": 4, "head_dim": 112, "n_experts": 4,
                  "top_k": 2, "gate": "sigmoid"},
    "ffn": {"type": "moe", "d_ff": 128, "n_experts": 32, "top_k": 4, "gate": "sigmoid",
            "activation": "relu"},
}


def log(msg):
    print(msg, file=sys.stderr, flush=True)


def prompt_ids(cfg, length, seed=0):
    """Fixed pseudo-random prompt; printable bytes for small byte-level vocabularies."""
    rng = random.Random(seed)
    lo, hi = (32, 127) if cfg["vocab_size"] <= 256 else (0, cfg["vocab_size"])
    return [rng.randrange(lo, hi) for _ in range(length)]


def reference_tokens_per_s(model, prompt, new_tokens, batch, min_seconds):
    """Greedy static batches of `batch` copies of `prompt`; repeats until min_seconds."""
    prompts = [list(prompt)] * batch
    model.generate(prompts[:1], 2)  # warm-up (allocator, thread pool)
    runs, start = 0, time.perf_counter()
    while True:
        out = model.generate(prompts, new_tokens)
        assert all(len(o) == new_tokens for o in out)
        runs += 1
        elapsed = time.perf_counter() - start
        if elapsed >= min_seconds:
            return runs * batch * new_tokens / elapsed, out[0]


THROUGHPUT = re.compile(r"throughput: ([\d.]+) requests/s, ([\d.]+) tokens/s")
OKS = re.compile(r"requests: (\d+) ok, (\d+) failed")


def requests_per_run(args, concurrency):
    """How many timed requests run_bench sends: --waves x concurrency, at
    least --min-requests."""
    return max(args.min_requests, args.waves * concurrency)


def run_bench(args, target, prompt, new_tokens, concurrency):
    requests = requests_per_run(args, concurrency)
    # One wave of warm-up requests first, left out of the figures (the
    # reference's generate() is warmed up too).
    cmd = [args.bench, *target, "--mode", "closed", "--concurrency", str(concurrency),
           "--requests", str(requests), "--warmup-requests", str(concurrency),
           "--prompt-ids", ",".join(map(str, prompt)),
           "--max-new-tokens", str(new_tokens), "--temperature", "0", "--ignore-eos"]
    out = subprocess.run(cmd, check=True, capture_output=True, text=True).stdout
    ok, failed = map(int, OKS.search(out).groups())
    if failed or ok != requests:
        raise SystemExit(f"{' '.join(cmd)}: {failed} requests failed\n{out}")
    return float(THROUGHPUT.search(out).group(2)), out


_GIVEN_PORTS = set()


def free_port():
    """A loopback TCP port that was free a moment ago, for a flag that takes
    a fixed port (--http-port, --metrics-port), never one given before: the
    kernel can hand the same free port out twice in a row."""
    while True:
        with socket.socket() as sock:
            sock.bind(("127.0.0.1", 0))
            port = sock.getsockname()[1]
        if port not in _GIVEN_PORTS:
            _GIVEN_PORTS.add(port)
            return port


class Server:
    """`switchserve serve --port 0` on loopback; the port comes from its log.
    `metrics_port` 0: no exporter."""

    def __init__(self, binary, model_dir, threads, device, extra_args=(), metrics_port=0):
        self.log = tempfile.TemporaryFile(mode="w+")
        self.metrics_port = metrics_port
        self.proc = subprocess.Popen(
            [binary, "serve", "--model", model_dir, "--host", "127.0.0.1", "--port", "0",
             "--metrics-port", str(metrics_port), "--threads", str(threads), "--device", device,
             *extra_args],
            stdout=subprocess.DEVNULL, stderr=self.log, text=True)
        deadline = time.time() + 600
        while time.time() < deadline:
            self.log.seek(0)
            m = re.search(r"listening on 127\.0\.0\.1:(\d+)", self.log.read())
            if m:
                self.address = f"127.0.0.1:{m.group(1)}"
                return
            if self.proc.poll() is not None:
                self.log.seek(0)
                raise SystemExit(f"switchserve serve exited:\n{self.log.read()}")
            time.sleep(0.2)
        raise SystemExit("switchserve serve did not start in 600 s")

    def metric_total(self, name):
        """The sum of the series of metric `name` in a scrape of the exporter."""
        url = f"http://127.0.0.1:{self.metrics_port}/metrics"
        with urllib.request.urlopen(url) as response:
            text = response.read().decode()
        return sum(float(m.group(1)) for m in
                   re.finditer(rf"^{name}(?:{{[^}}]*}})? (\S+)$", text, re.MULTILINE))

    def close(self):
        self.proc.terminate()
        self.proc.wait(timeout=60)


def load_reference(args, model_dir, dtype):
    model = load_model(model_dir, REF_DTYPES[dtype]).to(args.ref_device)
    if args.ref_compile:
        if not hasattr(torch, "compile"):
            raise SystemExit(f"--ref-compile: torch {torch.__version__} has no torch.compile")
        model.forward = torch.compile(model.forward)
    return model


def compare(args, model_dir, prompt_len, new_tokens, label):
    with open(os.path.join(model_dir, "config.json")) as f:
        cfg = json.load(f)
    prompt = prompt_ids(cfg, prompt_len)
    assert prompt_len + new_tokens <= cfg["max_seq_len"], "prompt + new tokens exceed the context"
    log(f"[{label}] loading the reference ({','.join(args.ref_dtypes)} on {args.ref_device}); "
        "starting switchserve serve")
    models = {dtype: load_reference(args, model_dir, dtype) for dtype in args.ref_dtypes}
    server = Server(args.switchserve, model_dir, args.threads, args.device)
    rows = {}
    # Level by level, reference then engine then gRPC, so that drifts in a
    # shared machine's load hit them about alike.
    try:
        for level in sorted(set(args.concurrency) | set(args.ref_batches)):
            if level in args.ref_batches:
                for dtype, model in models.items():
                    log(f"[{label}] reference {dtype}, static batch {level}")
                    rows[(dtype, level)], _ = reference_tokens_per_s(model, prompt, new_tokens,
                                                                     level, args.min_seconds)
            if level in args.concurrency:
                log(f"[{label}] engine in-process, concurrency {level}")
                rows[("engine", level)], _ = run_bench(
                    args, ["--engine-model", model_dir, "--threads", str(args.threads),
                           "--device", args.device], prompt, new_tokens, level)
                log(f"[{label}] gRPC, concurrency {level}")
                rows[("grpc", level)], _ = run_bench(args, ["--address", server.address], prompt,
                                                     new_tokens, level)
    finally:
        server.close()
    del models

    compiled = ", torch.compile" if args.ref_compile else ""
    print(f"\n## {label}: {model_dir}")
    print(f"device {args.device}, reference on {args.ref_device}{compiled}; "
          f"prompt {prompt_len} tokens, {new_tokens} new tokens, greedy, ignore_eos, "
          f"threads {args.threads}; closed loop, max({args.min_requests}, {args.waves} x "
          f"concurrency) requests per switchserve run after one wave of warm-up\n")
    refs = args.ref_dtypes
    print("| concurrency / batch | " + " | ".join(f"reference {d} tokens/s" for d in refs)
          + " | engine tokens/s | gRPC tokens/s | "
          + " | ".join(f"engine / reference {d}" for d in refs) + " | gRPC / engine |")
    print("|" + " --- |" * (2 * len(refs) + 4))
    cell = lambda v: f"{v:.1f}" if v is not None else "—"  # noqa: E731
    ratio = lambda a, b: f"{a / b:.2f}x" if a and b else "—"  # noqa: E731
    for c in sorted(set(args.concurrency) | set(args.ref_batches)):
        eng, rpc = rows.get(("engine", c)), rows.get(("grpc", c))
        ref = [rows.get((d, c)) for d in refs]
        print(f"| {c} | " + " | ".join(cell(r) for r in ref) + f" | {cell(eng)} | {cell(rpc)} | "
              + " | ".join(ratio(eng, r) for r in ref) + f" | {ratio(rpc, eng)} |")
    sys.stdout.flush()
    return rows


def reference_perplexity(model_dir, text_path):
    model = load_model(model_dir, torch.float32)
    with open(text_path, "rb") as f:
        data = f.read()
    try:  # the train branch's scorer, when this tree has it
        import score_reference
        ids = score_reference.encode(model, data)
        res = score_reference.score_model(model, ids)
        return math.exp(res["nll_sum"] / res["predicted"]), "tools/score_reference.py"
    except ImportError:
        pass
    cfg = model.cfg
    if cfg["tokenizer"] != "byte":
        raise SystemExit("reference scoring here handles byte-level models only")
    ids = ([cfg["bos_token_id"]] if cfg["bos_token_id"] is not None else []) + list(data)
    ids = torch.tensor(ids, dtype=torch.int64)
    L = cfg["max_seq_len"]
    nll, predicted = 0.0, 0
    for s in range(0, len(ids) - 1, L - 1):  # windows overlapping by one token
        win = ids[s:s + L]
        logp = torch.log_softmax(model(win[None])["logits"][0, :-1].double(), -1)
        nll -= float(logp.gather(1, win[1:, None]).sum())
        predicted += len(win) - 1
    return math.exp(nll / predicted), "bench/compare_pytorch.py windowing"


def score(args, model_dir):
    out = subprocess.run([args.switchserve, "score", "--model", model_dir, "--text", args.heldout,
                          "--threads", str(args.threads)],
                         check=True, capture_output=True, text=True).stdout
    ours = float(re.search(r"perplexity: ([\d.]+)", out).group(1))
    ref, how = reference_perplexity(model_dir, args.heldout)
    rel = abs(ours - ref) / ref
    print(f"\n## held-out perplexity: {args.heldout} with {model_dir}")
    print(f"switchserve score: {ours:.6f}   reference ({how}, float32): {ref:.6f}   "
          f"relative difference {rel:.2e} ({'agree' if rel <= 1e-4 else 'DISAGREE'} at 1e-4)")
    return rel <= 1e-4


REF_DTYPES = {"f32": torch.float32, "bf16": torch.bfloat16}


def openblas_kernels():
    """OpenBLAS's name for the kernels it runs here, and what chose them."""
    try:
        lib = ctypes.CDLL("libopenblas.so.0")
        lib.openblas_get_corename.restype = ctypes.c_char_p
        name = lib.openblas_get_corename().decode()
    except (OSError, AttributeError):
        return "(no libopenblas.so.0)"
    forced = os.environ.get("OPENBLAS_CORETYPE")
    return f"{name} (OPENBLAS_CORETYPE={forced})" if forced else name


def main():
    ap = argparse.ArgumentParser(description=__doc__,
                                 formatter_class=argparse.RawDescriptionHelpFormatter)
    default_model = os.path.join(ROOT, "models", "default")
    if not os.path.exists(os.path.join(default_model, "config.json")):
        default_model = os.path.join(ROOT, "tests", "golden", "switchall_f16")
    ap.add_argument("--model", default=default_model)
    ap.add_argument("--build-dir", default=os.path.join(ROOT, "build", "release"))
    ap.add_argument("--threads", type=int, default=os.cpu_count())
    ap.add_argument("--prompt-len", type=int, default=16)
    ap.add_argument("--new-tokens", type=int, default=32)
    ap.add_argument("--concurrency", default="1,8,32")
    ap.add_argument("--ref-batches", default="1,8,32")
    ap.add_argument("--waves", type=int, default=2,
                    help="switchserve requests per run: waves x concurrency (at least --min-requests)")
    ap.add_argument("--min-requests", type=int, default=8)
    ap.add_argument("--min-seconds", type=float, default=3.0,
                    help="reference: repeat generate() until this much time has passed")
    ap.add_argument("--heldout", default=os.path.join(ROOT, "models", "heldout.txt"))
    ap.add_argument("--skip-model", action="store_true", help="only the paper-shaped model")
    ap.add_argument("--paper", action="store_true", help="also the paper-shaped random model")
    ap.add_argument("--paper-dir")
    ap.add_argument("--paper-prompt-len", type=int, default=32)
    ap.add_argument("--paper-new-tokens", type=int, default=16)
    ap.add_argument("--device", default="cpu", choices=["cpu", "cuda"])
    ap.add_argument("--ref-device", choices=["cpu", "cuda"],
                    help="where the reference runs (default: --device)")
    ap.add_argument("--ref-dtypes",
                    help="the reference's dtypes, comma-separated, of "
                    f"{','.join(sorted(REF_DTYPES))} (default: f32 on cpu, bf16 on cuda)")
    ap.add_argument("--ref-compile", action="store_true",
                    help="run the reference's forward through torch.compile")
    ap.add_argument("--paper-dtype", default="f32", choices=["f32", "bf16"],
                    help="the dtype the paper-shaped model is stored (and served) in")
    ap.add_argument("--keep-openblas-coretype", action="store_true",
                    help="keep the environment's OPENBLAS_CORETYPE (by default the script sets "
                    "the core engine_bench --openblas-core names, or drops the variable)")
    args = ap.parse_args()
    if args.ref_device is None:
        args.ref_device = args.device
    if args.ref_dtypes is None:
        args.ref_dtypes = "bf16" if args.ref_device == "cuda" else "f32"
    args.ref_dtypes = args.ref_dtypes.split(",")
    for dtype in args.ref_dtypes:
        if dtype not in REF_DTYPES:
            ap.error(f"--ref-dtypes: {dtype} is not one of {','.join(sorted(REF_DTYPES))}")
    if args.paper_dir is None:
        args.paper_dir = os.path.join(tempfile.gettempdir(), f"switchserve_paper_{args.paper_dtype}")
    args.concurrency = [int(c) for c in args.concurrency.split(",")]
    args.ref_batches = [int(c) for c in args.ref_batches.split(",")]
    args.bench = os.path.join(args.build_dir, "bench", "switchserve-bench")
    args.switchserve = os.path.join(args.build_dir, "server", "switchserve")
    torch.set_num_threads(args.threads)
    torch.manual_seed(0)

    print(f"# switchserve vs PyTorch reference ({time.strftime('%Y-%m-%d %H:%M UTC', time.gmtime())}, "
          f"{os.cpu_count()} cores, torch {torch.__version__} threads {torch.get_num_threads()}, "
          f"OpenBLAS kernels {openblas_kernels()}, load average {os.getloadavg()[0]:.1f})")
    agree = True
    if not args.skip_model:
        compare(args, args.model, args.prompt_len, args.new_tokens, "model")
        if os.path.exists(args.heldout):
            agree = score(args, args.model)
        else:
            print(f"\n(no {args.heldout}: perplexity comparison skipped)")
    if args.paper:
        if not os.path.exists(os.path.join(args.paper_dir, "model.safetensors")):
            log(f"writing the paper-shaped random model to {args.paper_dir}")
            save_model(init_random(Model(PAPER_CONFIG), seed=0), args.paper_dir, args.paper_dtype)
        compare(args, args.paper_dir, args.paper_prompt_len, args.paper_new_tokens, "paper-shaped")
    print(f"\n(load average at the end: {os.getloadavg()[0]:.1f})")
    return 0 if agree else 1


if __name__ == "__main__":
    sys.exit(main())

"""What the metrics cost: generated tokens per second of `switchserve serve`
with all metrics on vs --no-moe-metrics, under N concurrent gRPC clients, with
/metrics scraped every second in both (docs/performance.md). Not a test.

  build/metrics/tests/switchserve_metrics_paper_model /tmp/paper
  /usr/bin/python3 tests/metrics/measure_overhead.py \
      --binary build/metrics/server/switchserve --model /tmp/paper
"""

import argparse
import json
import os
import statistics
import subprocess
import sys
import tempfile
import threading
import time
import urllib.request

sys.path.insert(0, os.path.dirname(os.path.abspath(__file__)))
from prom_harness import SOURCE_DIR, free_port  # noqa: E402
from test_serve_metrics import load_stubs  # noqa: E402


def scrape_value(text, name):
    for line in text.splitlines():
        if line.startswith(name + " "):
            return float(line.split()[1])
    return float("nan")


def run_once(args, moe_metrics, pb2, pb2_grpc):
    import grpc

    port, metrics_port = free_port(), free_port()
    command = [
        args.binary, "serve", f"--model={args.model}", "--host=127.0.0.1", f"--port={port}",
        f"--metrics-port={metrics_port}", f"--max-running-requests={args.clients}",
    ]
    if not moe_metrics:
        command.append("--no-moe-metrics")
    server = subprocess.Popen(command, stdout=subprocess.DEVNULL, stderr=subprocess.DEVNULL)
    try:
        channel = grpc.insecure_channel(f"127.0.0.1:{port}")
        grpc.channel_ready_future(channel).result(timeout=60)
        stub = pb2_grpc.GenerationStub(channel)
        stop = threading.Event()
        measuring = threading.Event()
        counts = [0] * args.clients
        scrapes = [0]

        def client(i):
            prompt = [32 + (i * 13 + k) % 90 for k in range(args.prompt_tokens)]
            while not stop.is_set():
                request = pb2.GenerateRequest(
                    token_ids=pb2.TokenIds(ids=prompt),
                    sampling=pb2.SamplingParams(
                        max_new_tokens=args.new_tokens, temperature=0, ignore_eos=True),
                )
                response = stub.Generate(request, timeout=300)
                if measuring.is_set() and not stop.is_set():
                    counts[i] += len(response.token_ids)

        def scraper():
            while not stop.is_set():
                with urllib.request.urlopen(f"http://127.0.0.1:{metrics_port}/metrics") as r:
                    r.read()
                scrapes[0] += 1
                stop.wait(args.scrape_interval)

        threads = [threading.Thread(target=client, args=(i,)) for i in range(args.clients)]
        threads.append(threading.Thread(target=scraper))
        for t in threads:
            t.start()
        time.sleep(args.warmup)
        with urllib.request.urlopen(f"http://127.0.0.1:{metrics_port}/metrics") as r:
            start_text = r.read().decode()
        measuring.set()
        t0 = time.monotonic()
        time.sleep(args.seconds)
        stop.set()
        elapsed = time.monotonic() - t0
        with urllib.request.urlopen(f"http://127.0.0.1:{metrics_port}/metrics") as r:
            end_text = r.read().decode()
        for t in threads:
            t.join()
        steps = (scrape_value(end_text, "switchserve_step_duration_seconds_count")
                 - scrape_value(start_text, "switchserve_step_duration_seconds_count"))
        step_seconds = (scrape_value(end_text, "switchserve_step_duration_seconds_sum")
                        - scrape_value(start_text, "switchserve_step_duration_seconds_sum"))
        step_tokens = (scrape_value(end_text, "switchserve_step_tokens_sum")
                       - scrape_value(start_text, "switchserve_step_tokens_sum"))
        cpu_seconds = (scrape_value(end_text, "process_cpu_seconds_total")
                       - scrape_value(start_text, "process_cpu_seconds_total"))
        channel.close()
        return {
            "moe_metrics": moe_metrics,
            # Tokens computed (prefill + decode) per second, from the server's
            # own step histogram: finer-grained than completed requests.
            "step_tokens_per_s": step_tokens / elapsed,
            "completed_tokens_per_s": sum(counts) / elapsed,
            # Server CPU time per 1000 computed tokens: less sensitive than
            # wall time to other load on the machine.
            "cpu_ms_per_1k_tokens": 1e6 * cpu_seconds / step_tokens if step_tokens else float("nan"),
            "mean_step_ms": 1e3 * step_seconds / steps if steps else float("nan"),
            "tokens_per_step": step_tokens / steps if steps else float("nan"),
            "scrape_bytes": len(end_text),
        }
    finally:
        server.terminate()
        server.wait(timeout=60)


def main():
    ap = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    ap.add_argument("--binary", required=True)
    ap.add_argument("--model", required=True)
    ap.add_argument("--clients", type=int, default=32)
    ap.add_argument("--prompt-tokens", type=int, default=8)
    ap.add_argument("--new-tokens", type=int, default=32)
    ap.add_argument("--seconds", type=float, default=20)
    ap.add_argument("--warmup", type=float, default=5)
    ap.add_argument("--repeats", type=int, default=3)
    ap.add_argument("--scrape-interval", type=float, default=1.0)
    args = ap.parse_args()
    pb2, pb2_grpc = load_stubs(__import__("pathlib").Path(tempfile.mkdtemp()))
    runs = []
    for r in range(args.repeats):
        # Alternate the order so drift (other load on the machine) hits both.
        for moe in ([True, False] if r % 2 == 0 else [False, True]):
            runs.append(run_once(args, moe, pb2, pb2_grpc))
            print(json.dumps(runs[-1]), flush=True)
    summary = {"clients": args.clients}
    for key in ["step_tokens_per_s", "cpu_ms_per_1k_tokens"]:
        on = [x[key] for x in runs if x["moe_metrics"]]
        off = [x[key] for x in runs if not x["moe_metrics"]]
        summary[key] = {
            "on": on,
            "off": off,
            "on_over_off_of_medians": statistics.median(on) / statistics.median(off),
            "on_over_off_of_means": statistics.mean(on) / statistics.mean(off),
        }
    print(json.dumps(summary))


if __name__ == "__main__":
    assert SOURCE_DIR
    main()

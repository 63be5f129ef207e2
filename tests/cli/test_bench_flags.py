"""switchserve-bench's flags at their edges: each is refused before any
request is sent, naming the flag (exit code 2), instead of a run whose every
request failed or whose arrivals were undefined, reported with exit code 0."""
import os
import pathlib
import subprocess

import pytest

ROOT = pathlib.Path(__file__).resolve().parents[2]
BENCH = os.environ.get("SWITCHSERVE_BENCH")
pytestmark = pytest.mark.skipif(not BENCH, reason="switchserve-bench not built "
                                "(SWITCHSERVE_BUILD_BENCH=OFF)")
# In process: refused flags must not get as far as loading it.
ENGINE = ["--engine-model", str(ROOT / "tests" / "golden" / "switchall_f16"), "--threads", "1",
          "--max-new-tokens", "2", "--requests", "2"]


def bench(*args):
    return subprocess.run([BENCH, *ENGINE, *args], capture_output=True, text=True, timeout=60)


@pytest.mark.parametrize("args, expected", [
    # Every request failed at once (a deadline in the past), exit code 0.
    (["--timeout-s", "0"], "--timeout-s: must be in (0, 1e+06] seconds, found 0"),
    (["--timeout-s", "-1"], "--timeout-s: must be in (0, 1e+06] seconds, found -1"),
    (["--timeout-s", "nan"], "--timeout-s: must be in (0, 1e+06] seconds, found nan"),
    (["--timeout-s", "1e300"], "--timeout-s: must be in (0, 1e+06] seconds, found 1e+300"),
    # Arrival gaps out of the clock's range, or none at all.
    (["--mode", "open", "--rate", "nan"], "--rate: must be in [1e-06, 1e+09] requests a second, found nan"),
    (["--mode", "open", "--rate", "inf"], "--rate: must be in [1e-06, 1e+09] requests a second, found inf"),
    (["--mode", "open", "--rate", "1e-300"],
     "--rate: must be in [1e-06, 1e+09] requests a second, found 1e-300"),
    (["--mode", "opne"], '--mode: expected closed or open, found "opne"'),
    (["--concurrency", "0"], "--concurrency: must be >= 1, found 0"),
    (["--warmup-requests", "-1"], "--warmup-requests: must be >= 0, found -1"),
    (["--requests", "0"], "--requests: must be >= 1, found 0"),
    # absl drops words no flag takes.
    (["--ignore-eos", "false"], 'unexpected argument "false"'),
])
def test_bench_refuses_flags_out_of_range(args, expected):
    result = bench(*args)
    assert result.returncode == 2, result.stdout + result.stderr
    assert f"switchserve-bench: {expected}" in result.stderr, result.stderr
    assert "requests:" not in result.stdout


def test_bench_runs_at_the_edges_it_accepts():
    result = bench("--mode", "open", "--rate", "1e9", "--timeout-s", "1e6")
    assert result.returncode == 0, result.stderr
    assert "requests: 2 ok, 0 failed" in result.stdout, result.stdout


@pytest.mark.parametrize("address, expected", [
    # A host name: the HTTP client connects to an address and resolves
    # nothing (it used to abort on an uncaught exception, exit code 134).
    ("localhost:8000", '--http-address: want IP:PORT with an IPv4 or IPv6 address, not a host name, '
                       'found "localhost:8000"'),
    ("127.0.0.1", '--http-address: want IP:PORT, found "127.0.0.1"'),
    # Ports past 65535 wrapped around to another port.
    ("127.0.0.1:99999", "--http-address: the port must be in [1, 65535], found 99999"),
    ("127.0.0.1:0", "--http-address: the port must be in [1, 65535], found 0"),
])
def test_bench_refuses_an_http_address_it_cannot_connect_to(address, expected):
    result = subprocess.run([BENCH, "--http-address", address, "--requests", "2"],
                            capture_output=True, text=True, timeout=60)
    assert result.returncode == 2, result.stdout + result.stderr
    assert f"switchserve-bench: {expected}" in result.stderr, result.stderr
    assert "requests:" not in result.stdout

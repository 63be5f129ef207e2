"""The SIMT executor under a process thread limit: a host thread the system
refuses ended the process in std::terminate at the first kernel launch (the
pool's std::vector of threads destroyed joinable), and a pool that had started
fewer threads than it was asked for would have waited for ever for the
missing ones. Now the pool runs blocks on the threads it has, the watchdog
(started first) is left out only when not even it can start, and each
shortfall is one stderr line."""
import os
import subprocess

import pytest
from thread_limit import as_nobody_limited, skip_unless_nobody_may

EXECUTOR_TEST = os.environ.get("SWITCHSERVE_SIMT_EXECUTOR_TEST")
pytestmark = pytest.mark.skipif(not EXECUTOR_TEST, reason="the SIMT executor is not built "
                                "(no CUDA toolkit headers or Boost.Context)")
HOST_THREADS = 8
# Needs two host threads: it launches two blocks that wait for each other.
CONCURRENT_TEST = "SimtSharedMemory.ConcurrentBlocksHaveTheirOwnSharedArrays"


def run_as_nobody(limit, *args):
    """The executor's tests as user nobody, its user allowed `limit` threads
    (RLIMIT_NPROC; root is not held to it): (exit code, stderr)."""
    skip_unless_nobody_may("-x", EXECUTOR_TEST, what="run the test binary")
    # OpenBLAS's threads are not the executor's; LeakSanitizer's check at
    # exit (the ASan build) needs a thread of its own that the limit refuses.
    asan_options = ":".join(filter(None, [os.environ.get("ASAN_OPTIONS"), "detect_leaks=0"]))
    process = subprocess.run(
        as_nobody_limited(limit, EXECUTOR_TEST, "--gtest_brief=1", *args),
        capture_output=True, text=True, timeout=120,
        env=dict(os.environ, SWITCHSERVE_SIMT_THREADS=str(HOST_THREADS), OPENBLAS_NUM_THREADS="1",
                 OMP_NUM_THREADS="1", ASAN_OPTIONS=asan_options))
    return process.returncode, process.stderr


@pytest.mark.parametrize("limit", range(1, HOST_THREADS + 2))
def test_launches_run_on_the_host_threads_a_thread_limit_leaves(limit):
    # The caller's thread, then the watchdog's, then the pool's.
    args = [f"--gtest_filter=-{CONCURRENT_TEST}"] if limit <= 2 else []
    code, stderr = run_as_nobody(limit, *args)
    assert code == 0, stderr
    lines = [line for line in stderr.splitlines() if line.startswith("simt:")]
    expected = []
    if limit == 1:
        expected.append("simt: watchdog thread not started (Resource temporarily unavailable): "
                        "launches run unwatched")
    if limit <= HOST_THREADS:
        started = max(limit - 2, 0)
        expected.append(f"simt: host thread {started + 2} of {HOST_THREADS} not started "
                        f"(Resource temporarily unavailable): blocks run on {started + 1}")
    assert lines == expected, stderr

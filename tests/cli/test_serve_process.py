"""`switchserve serve` as its supervisor meets it: a listener it cannot open
ends it with exit code 1 and a last line that says why, a log reader that
goes away does not end it, a stop signal while it starts drains it, and its
startup warnings are warning lines a log pipeline can select."""
import contextlib
import json
import os
import pathlib
import queue
import resource
import shutil
import signal
import socket
import subprocess
import threading
import time

import pytest

from server_process import free_port
from thread_limit import as_nobody_limited, skip_unless_nobody_may

ROOT = pathlib.Path(__file__).resolve().parents[2]
BINARY = os.environ["SWITCHSERVE_BINARY"]
DEFAULT_MODEL = ROOT / "models" / "default"
GOLDEN = ROOT / "tests" / "golden"
# TEST-NET-1 (RFC 5737): an address no interface of this host has.
NOT_OURS = "192.0.2.1"


def serve(*args, timeout=60):
    """Runs `serve` to its end; (exit code, stderr)."""
    result = subprocess.run([BINARY, "serve", "--model", str(DEFAULT_MODEL), *args],
                            stdout=subprocess.DEVNULL, stderr=subprocess.PIPE, text=True,
                            timeout=timeout)
    return result.returncode, result.stderr


def last_line(stderr):
    lines = stderr.strip().splitlines()
    return lines[-1] if lines else ""


# gRPC's listener said only "cannot listen on HOST:PORT" (the reason was in a
# gRPC error line before it), the metrics exporter's "null context when
# constructing CivetServer. Possible problem binding to port."
@pytest.mark.parametrize("flag, prefix", [
    ("--port", ""),
    ("--http-port", "HTTP: "),
    ("--metrics-port", "metrics: "),
])
def test_a_port_in_use_is_named_in_the_last_line(flag, prefix):
    with socket.socket() as held:
        held.bind(("127.0.0.1", 0))
        held.listen()
        port = held.getsockname()[1]
        ports = {"--port": "0", "--http-port": "0", "--metrics-port": "0"}
        ports[flag] = str(port)
        args = [arg for name, value in ports.items() for arg in (name, value)]
        code, stderr = serve("--host", "127.0.0.1", *args)
    assert code == 1, stderr
    line = last_line(stderr)
    assert f"{prefix}cannot listen on 127.0.0.1:{port} (bind: Address already in use)" in line, \
        stderr


@pytest.mark.parametrize("args, prefix, host_port", [
    (["--host", NOT_OURS, "--port", "0", "--metrics-port", "0"], "", f"{NOT_OURS}:0"),
    (["--host", "127.0.0.1", "--port", "0", "--metrics-host", NOT_OURS, "--metrics-port", "PORT"],
     "metrics: ", f"{NOT_OURS}:PORT"),
])
def test_an_address_of_another_host_is_named_in_the_last_line(args, prefix, host_port):
    port = str(free_port())
    code, stderr = serve(*[port if arg == "PORT" else arg for arg in args])
    assert code == 1, stderr
    line = last_line(stderr)
    expected = f"{prefix}cannot listen on {host_port.replace('PORT', port)}"
    assert f"{expected} (bind: Cannot assign requested address)" in line, stderr


# Without the metrics exporter (civetweb ignores SIGPIPE for the process) the
# first log line after the pipe closed ended the server on SIGPIPE: here the
# "received Terminated" line, so no drain and exit code -13.
def test_a_log_pipe_whose_reader_went_away_does_not_end_the_server():
    process = subprocess.Popen(
        [BINARY, "serve", "--model", str(DEFAULT_MODEL), "--host", "127.0.0.1", "--port", "0",
         "--metrics-port", "0"], stdout=subprocess.DEVNULL, stderr=subprocess.PIPE)
    try:
        deadline = time.monotonic() + 60
        while b"listening on" not in process.stderr.readline():
            assert process.poll() is None and time.monotonic() < deadline, "serve did not start"
        process.stderr.close()
        process.send_signal(signal.SIGTERM)
        assert process.wait(timeout=30) == 0
    finally:
        if process.poll() is None:
            process.kill()
            process.wait()


def test_a_stop_signal_while_libraries_load_drains_once_the_server_is_up():
    """OpenBLAS starts its threads as it is loaded, before main. A SIGTERM
    then took its default action (exit -15, in the process's first ~80 ms):
    the stop signals are now blocked before any library's initialiser runs,
    so it waits for `serve`, which drains and exits 0."""
    process = subprocess.Popen(
        [BINARY, "serve", "--model", str(DEFAULT_MODEL), "--host", "127.0.0.1", "--port", "0",
         "--metrics-port", "0"], stdout=subprocess.DEVNULL, stderr=subprocess.PIPE, text=True)
    try:
        # A second thread: a library's initialiser has run (OpenBLAS's).
        deadline = time.monotonic() + 10
        while len(os.listdir(f"/proc/{process.pid}/task")) < 2:
            assert process.poll() is None and time.monotonic() < deadline, "no thread started"
        process.send_signal(signal.SIGTERM)
        assert process.wait(timeout=60) == 0
        assert "draining" in process.stderr.read()
    finally:
        if process.poll() is None:
            process.kill()
            process.wait()


def test_other_subcommands_keep_the_signal_mask_they_were_started_with():
    """The stop signals are blocked before main for `serve`; the other
    subcommands get back the mask they were started with: a SIGTERM their
    parent blocked stays blocked (they unblocked all three), SIGINT and
    SIGHUP stay unblocked."""
    port = free_port()
    with socket.socket() as silent:  # accepts, never answers: `health` waits
        silent.setsockopt(socket.SOL_SOCKET, socket.SO_REUSEADDR, 1)
        silent.bind(("127.0.0.1", port))
        silent.listen()
        silent.settimeout(30)
        process = subprocess.Popen(
            [BINARY, "health", "--address", f"127.0.0.1:{port}", "--timeout-s", "20"],
            stdout=subprocess.DEVNULL, stderr=subprocess.DEVNULL,
            preexec_fn=lambda: signal.pthread_sigmask(signal.SIG_BLOCK, {signal.SIGTERM}))
        try:
            connection, _ = silent.accept()  # main has run: the check is under way
            with connection, open(f"/proc/{process.pid}/task/{process.pid}/status") as status:
                blocked = next(int(line.split()[1], 16) for line in status
                               if line.startswith("SigBlk:"))
            stop_signals = {signal.SIGTERM, signal.SIGINT, signal.SIGHUP}
            assert {s for s in stop_signals if blocked & (1 << (s - 1))} == {signal.SIGTERM}, \
                hex(blocked)
        finally:
            process.kill()
            process.wait()


@contextlib.contextmanager
def listening_server(model, *args):
    """`serve` started and its log lines read up to `listening on`: yields
    (process, those lines); killed afterwards if still running."""
    process = subprocess.Popen(
        [BINARY, "serve", "--model", str(model), "--host", "127.0.0.1", "--port", "0",
         "--metrics-port", "0", *args], stdout=subprocess.DEVNULL, stderr=subprocess.PIPE,
        text=True)
    lines = []
    try:
        deadline = time.monotonic() + 60
        while not lines or "listening on" not in lines[-1]:
            assert process.poll() is None and time.monotonic() < deadline, "".join(lines)
            lines.append(process.stderr.readline())
        yield process, lines
    finally:
        if process.poll() is None:
            process.kill()
            process.wait()


def startup_log(model, *args):
    """The log lines of `serve` up to `listening on`, then SIGTERM."""
    with listening_server(model, *args) as (process, lines):
        process.send_signal(signal.SIGTERM)
        assert process.wait(timeout=30) == 0
    return lines


def test_startup_warnings_are_warning_lines(tmp_path):
    """The step scope's warning and the model's (here a NaN weight loaded
    with --allow-non-finite-weights) are `warning` lines: level "warning" in
    the JSON form, `warning: ` once in the text form. Both were info lines
    whose message said so, which a log pipeline filtering on the level
    missed."""
    source = GOLDEN / "dense_mha"
    data = bytearray((source / "model.safetensors").read_bytes())
    header_size = int.from_bytes(data[:8], "little")
    tensor = json.loads(data[8:8 + header_size])["layers.1.ffn.w2.weight"]
    assert tensor["dtype"] == "F32"
    start = 8 + header_size + tensor["data_offsets"][0]
    data[start + 7 * 4:start + 8 * 4] = b"\x00\x00\xc0\x7f"  # a float32 NaN
    (tmp_path / "model.safetensors").write_bytes(bytes(data))
    shutil.copy(source / "config.json", tmp_path / "config.json")
    flags = ["--capacity-scope", "step", "--capacity-factor", "1", "--allow-non-finite-weights"]
    expected = ['capacity_scope "step"', "tensor layers.1.ffn.w2.weight holds non-finite values"]

    json_lines = [json.loads(line)
                  for line in startup_log(tmp_path, "--log-format", "json", *flags)]
    for text in expected:
        found = [line for line in json_lines if text in line["msg"]]
        assert len(found) == 1, json_lines
        assert found[0]["level"] == "warning", found[0]
        assert not found[0]["msg"].lower().startswith("warning"), found[0]

    text_lines = startup_log(tmp_path, *flags)
    for text in expected:
        found = [line for line in text_lines if text in line]
        assert len(found) == 1, text_lines
        assert " switchserve: warning: " in found[0], found[0]
        assert found[0].lower().count("warning:") == 1, found[0]


def serve_as_nobody(limit, *args):
    """`serve --log-format json ...` started as user nobody, its user allowed
    `limit` threads (RLIMIT_NPROC; root is not held to it); stderr piped."""
    return subprocess.Popen(
        as_nobody_limited(limit, BINARY, "serve", "--model", str(DEFAULT_MODEL), "--host",
                          "127.0.0.1", "--port", "0", "--metrics-port", "0", "--log-format",
                          "json", *args),
        stdout=subprocess.DEVNULL, stderr=subprocess.PIPE, text=True,
        env=dict(os.environ, OPENBLAS_NUM_THREADS="1", OMP_NUM_THREADS="1"))


def run_as_nobody_with_threads_limited(limit, *args, timeout):
    """`serve --threads 1 ...` as serve_as_nobody: (exit code or None when it
    ran past `timeout`, stderr)."""
    process = serve_as_nobody(limit, "--threads", "1", *args)
    try:
        _, stderr = process.communicate(timeout=timeout)
        return process.returncode, stderr
    except subprocess.TimeoutExpired:
        process.kill()
        _, stderr = process.communicate()
        return None, stderr


def skip_unless_nobody_can_serve():
    skip_unless_nobody_may("-r", str(DEFAULT_MODEL / "model.safetensors"), "-a", "-x", BINARY,
                           what="read the model or run the binary")


def test_an_exception_that_ends_the_start_up_is_a_json_line():
    """A thread the system refuses to create (std::system_error), or an
    allocation that fails, ended `serve` with main()'s plain line
    ("switchserve serve: Resource temporarily unavailable") after the JSON
    lines of --log-format json. It is an error line in the log's format."""
    skip_unless_nobody_can_serve()
    # Too few threads for the model's load; too many, and gRPC's own
    # threads fail (gRPC aborts); in between, one of ours is refused.
    failed = None
    for limit in range(3, 33):
        code, stderr = run_as_nobody_with_threads_limited(limit, timeout=15)
        if code == 1:
            failed = stderr
            break
    assert failed is not None, "no thread limit made a thread of ours fail"
    lines = failed.splitlines()
    records = [json.loads(line) for line in lines]  # every line is JSON
    assert records[-1]["level"] == "error", lines
    assert records[-1]["msg"] == os.strerror(11), lines  # EAGAIN, from std::system_error


@pytest.mark.parametrize("limit", [1, 2, 3])
def test_a_start_up_that_fails_under_a_thread_limit_exits(limit):
    """With a thread gRPC could not create (its timer thread: a limit this
    low), the unwinding of the failed start-up waited in gRPC's teardown
    (grpc_shutdown) for that thread to end: the server hung for ever, idle,
    before its error line, where a supervisor waits for it to exit and
    restart it. It exits 1, its last line the error."""
    skip_unless_nobody_can_serve()
    code, stderr = run_as_nobody_with_threads_limited(limit, timeout=15)
    assert code is not None, f"still running 15 s on: {stderr}"
    assert code == 1, stderr
    records = [json.loads(line) for line in stderr.splitlines()]
    assert records[-1]["level"] == "error", records
    assert records[-1]["msg"] == os.strerror(11), records  # EAGAIN, from std::system_error


def log_record(line):
    """A line of `--log-format json`'s log; one that is not JSON (the C++
    runtime's own, before an abort) as the record {"level": None, "msg": line}."""
    try:
        return json.loads(line)
    except ValueError:
        return {"level": None, "msg": line.rstrip("\n")}


def start_as_nobody_with_threads_limited(limit, *args, timeout=15):
    """`serve ...` as serve_as_nobody, until it exits or logs that it
    listens: ("exited", code) or ("up", code of the exit SIGTERM then gives)
    or ("hung", None), with its log's records."""
    process = serve_as_nobody(limit, *args)
    lines = queue.Queue()  # stderr's lines, then None at its end
    reader = threading.Thread(target=lambda: [*map(lines.put, process.stderr), lines.put(None)])
    reader.start()
    records = []
    deadline = time.monotonic() + timeout
    try:
        while True:
            try:
                line = lines.get(timeout=max(0.0, deadline - time.monotonic()))
            except queue.Empty:
                return "hung", None, records
            if line is None:
                return "exited", process.wait(timeout=timeout), records
            records.append(log_record(line))
            if records[-1]["msg"].startswith("listening on"):
                process.send_signal(signal.SIGTERM)
                code = process.wait(timeout=30)
                while (line := lines.get(timeout=30)) is not None:
                    records.append(log_record(line))
                return "up", code, records
    finally:
        if process.poll() is None:
            process.kill()
            process.wait()
        reader.join()


@pytest.mark.parametrize("flags", [
    ("--noreflection", "--threads", "1"),
    ("--noreflection", "--threads", "4", "--http-port", "0"),
], ids=["grpc", "grpc-http-4-compute-threads"])
def test_every_thread_limit_ends_a_start_up_with_its_error_or_lets_it_serve(flags):
    """Each limit from 1 thread up makes the next thread the start-up creates
    fail, until one lets it serve: together they reach every thread it
    creates, in order. Each failure ends the process with status 1, its
    last line the error. Before: a compute or HTTP thread refused after
    others of the same pool had started ended the process in std::terminate
    (status 134, no error line), and one refused after gRPC's server was
    built hung for ever in the server's destruction, its stop signals
    blocked. (gRPC's reflection service runs on gRPC's own sync-server
    threads, whose failure gRPC ends with an assertion: --noreflection.)"""
    skip_unless_nobody_can_serve()

    def start(limit):
        # A fresh HTTP port for every start, and another try where the one
        # given was taken meanwhile (by a neighbouring test's connection)
        # before this start bound it.
        for _ in range(3):
            args = (*flags[:-1], str(free_port())) if "--http-port" in flags else flags
            outcome, code, records = start_as_nobody_with_threads_limited(limit, *args)
            if not (outcome == "exited" and records and
                    "Address already in use" in records[-1]["msg"]):
                break
        return outcome, code, records

    failed_limits = []
    for limit in range(1, 65):
        outcome, code, records = start(limit)
        assert outcome != "hung", (limit, records)
        if outcome == "up":
            assert code == 0, (limit, records)
            break
        assert code == 1, (limit, records)
        assert records[-1]["level"] == "error", (limit, records)
        assert records[-1]["msg"] == os.strerror(11), (limit, records)  # EAGAIN
        failed_limits.append(limit)
    else:
        pytest.fail("no limit up to 64 threads let the server start")
    assert failed_limits == list(range(1, limit)), failed_limits


def test_calls_cut_off_at_the_drain_timeout_are_a_warning():
    """The drain timeout ends calls still running (their clients get
    UNAVAILABLE): `drain timeout: cancelling 1 call` is a warning line, not
    an info line a log pipeline selecting warnings and errors misses."""
    http_port = free_port()
    with listening_server(DEFAULT_MODEL, "--http-port", str(http_port), "--threads", "1",
                          "--log-format", "json", "--drain-timeout-s", "1",
                          "--debug-step-delay-ms", "100") as (process, lines):
        body = b'{"prompt": "hi", "max_tokens": 200, "stream": true}'
        with socket.create_connection(("127.0.0.1", http_port), timeout=30) as client:
            client.sendall(b"POST /v1/completions HTTP/1.1\r\nHost: x\r\n"
                           b"Content-Type: application/json\r\nContent-Length: %d\r\n\r\n%s"
                           % (len(body), body))
            assert client.recv(65536).startswith(b"HTTP/1.1 200")  # it runs
            process.send_signal(signal.SIGTERM)
            assert process.wait(timeout=30) == 0
        lines += process.stderr.read().splitlines()
    records = [json.loads(line) for line in lines]
    cut = [r for r in records if r["msg"].startswith("drain timeout")]
    assert [(r["level"], r["msg"]) for r in cut] == [("warning",
                                                     "drain timeout: cancelling 1 call")], records


def test_a_server_that_cannot_start_under_an_address_space_limit_exits():
    """Under an address-space limit (`ulimit -v`) the pool threads that
    OpenBLAS starts as it loads could not get their buffers and retried for
    ever at full speed, and the exit waited for them: a server whose start-up
    failed (here a KV cache the limit leaves no room for) logged why, then
    neither exited nor answered SIGTERM. `serve` starts itself again without
    that pool (OPENBLAS_NUM_THREADS=1, which nothing else uses), and exits 1."""
    linked = subprocess.run(["ldd", BINARY], capture_output=True, text=True).stdout
    if "libasan" in linked:
        pytest.skip("AddressSanitizer reserves terabytes of address space: no limit fits")
    limit = 800 << 20

    def limit_address_space():
        resource.setrlimit(resource.RLIMIT_AS, (limit, limit))

    env = {k: v for k, v in os.environ.items() if k != "OPENBLAS_NUM_THREADS"}
    try:
        result = subprocess.run(
            [BINARY, "serve", "--model", str(DEFAULT_MODEL), "--host", "127.0.0.1", "--port", "0",
             "--metrics-port", "0", "--threads", "2", "--kv-cache-bytes", str(1 << 30)],
            stdout=subprocess.DEVNULL, stderr=subprocess.PIPE, text=True, env=env,
            preexec_fn=limit_address_space, timeout=30)
    except subprocess.TimeoutExpired as e:
        pytest.fail(f"still running 30 s on: {e.stderr}")
    assert result.returncode == 1, result.stderr
    assert "error:" in last_line(result.stderr) and "KV cache" in last_line(result.stderr), \
        result.stderr

"""A real `switchserve serve` process for the Python tests.

The server listens on the loopback interface; its gRPC port is 0 (the kernel
picks one) and is read from the server's log once it says it is listening. The
log (stdout and stderr) goes to a file in a fresh temporary folder, `dir`,
which a test may also use for its own files.
"""

import os
import re
import socket
import subprocess
import tempfile
import time
import urllib.request

LISTENING = re.compile(r"listening on 127\.0\.0\.1:(\d+)")
STARTUP_TIMEOUT_S = 120


_ports_given = set()


def free_port():
    """A loopback TCP port that was free a moment ago (for the flags that
    take a fixed port: --metrics-port, --http-port), and not one this
    process was given before: the kernel can hand the same free port out
    twice in a row, and a server given it for two listeners refuses to
    start."""
    while True:
        with socket.socket() as s:
            s.bind(("127.0.0.1", 0))
            port = s.getsockname()[1]
        if port not in _ports_given:
            _ports_given.add(port)
            return port


VERSION_LINE = re.compile(r"switchserve (\S+) \(revision (\S+)\)")


def binary_version(binary):
    """(release, revision) as `switchserve --version` prints them."""
    out = subprocess.run([binary, "--version"], capture_output=True, text=True, timeout=60,
                         check=True).stdout
    match = VERSION_LINE.match(out)
    assert match, out
    return match.group(1), match.group(2)


class ServerProcess:
    """`switchserve serve --model MODEL` on 127.0.0.1 with one thread, the
    gRPC port chosen by the kernel, metrics on `metrics_port` (0: none) and
    `extra_args` last. The constructor returns once the server listens
    (`port`, `address`) and raises RuntimeError with the log if it exits or
    does not listen within two minutes. close() stops it with SIGKILL."""

    def __init__(self, binary, model, *extra_args, metrics_port=0, prefix="switchserve_"):
        self.dir = tempfile.mkdtemp(prefix=prefix)
        self.log_path = os.path.join(self.dir, "server.log")
        self.metrics_port = metrics_port
        with open(self.log_path, "w") as log:
            self.process = subprocess.Popen(
                [binary, "serve", "--model", str(model), "--host", "127.0.0.1", "--port", "0",
                 "--metrics-port", str(metrics_port), "--threads", "1", *extra_args],
                stdout=log, stderr=subprocess.STDOUT)
        deadline = time.monotonic() + STARTUP_TIMEOUT_S
        while time.monotonic() < deadline:
            match = LISTENING.search(self.log())
            if match:
                self.port = int(match.group(1))
                self.address = f"127.0.0.1:{self.port}"
                return
            if self.process.poll() is not None:
                raise RuntimeError("server exited during startup:\n" + self.log())
            time.sleep(0.02)
        self.close()
        raise RuntimeError("server did not start:\n" + self.log())

    def log(self):
        """Everything the server has written so far."""
        with open(self.log_path) as f:
            return f.read()

    def channel(self):
        """An insecure gRPC channel to the server (grpc is imported here, so
        that tests which never open a channel do not need it)."""
        import grpc
        return grpc.insecure_channel(self.address)

    def scrape_metrics(self):
        """The text of the Prometheus endpoint (needs a metrics_port)."""
        with urllib.request.urlopen(f"http://127.0.0.1:{self.metrics_port}/metrics",
                                    timeout=10) as response:
            return response.read().decode()

    def scrape_metrics_after_steps(self, tokens, timeout_s=10):
        """The metrics once the engine's steps have computed `tokens` tokens
        in all (switchserve_step_tokens_sum; or after `timeout_s`). The engine
        records a step after handing out its tokens: a request's last step
        can reach the metrics just after its client has the response. A scrape
        with a step's serving figures has its routing (switchserve_moe_*) too."""
        deadline = time.monotonic() + timeout_s
        while True:
            text = self.scrape_metrics()
            match = re.search(r"^switchserve_step_tokens_sum (\S+)$", text, re.MULTILINE)
            if (match and float(match.group(1)) >= tokens) or time.monotonic() > deadline:
                return text
            time.sleep(0.05)

    def close(self):
        if self.process.poll() is None:
            self.process.kill()
            self.process.wait()

"""Sizes and values from config.json and flags at their extremes, against the
real binary: each is refused with a message (or served within bounds) before
anything large is allocated, and no process ends on a signal (std::terminate's
abort, the OOM killer)."""
import json
import os
import pathlib
import subprocess
import tempfile
import time

import pytest

ROOT = pathlib.Path(__file__).resolve().parents[2]
BINARY = os.environ["SWITCHSERVE_BINARY"]
DEFAULT_MODEL = ROOT / "models" / "default"
# Far below what the sizes under test used to allocate (0.7 to 20 GB), far
# above what the binary needs (about 25 MB; more under ASan).
MAX_RSS_KB = 400 * 1024


def run_measured(*args, timeout=60):
    """Runs the binary; (exit code, or -signal; stderr; its peak RSS in KiB)."""
    with tempfile.TemporaryFile(mode="w+") as stderr:
        process = subprocess.Popen([BINARY, *args], stdout=subprocess.DEVNULL, stderr=stderr)
        deadline = time.monotonic() + timeout
        while True:
            pid, status, usage = os.wait4(process.pid, os.WNOHANG)
            if pid == process.pid:
                break
            if time.monotonic() > deadline:
                process.kill()
                os.wait4(process.pid, 0)
                pytest.fail(f"{args} still running after {timeout} s")
            time.sleep(0.02)
        process.returncode = os.waitstatus_to_exitcode(status)
        stderr.seek(0)
        return process.returncode, stderr.read(), usage.ru_maxrss


def model_variant(tmp_path, name, **config_changes):
    """The built-in model with some config.json keys changed (same weights)."""
    model = tmp_path / name
    model.mkdir()
    config = json.loads((DEFAULT_MODEL / "config.json").read_text())
    config.update(config_changes)
    (model / "config.json").write_text(json.dumps(config))
    (model / "model.safetensors").symlink_to(DEFAULT_MODEL / "model.safetensors")
    return model


@pytest.mark.parametrize("max_seq_len", [10**7, 10**8, 2**31 - 1])
def test_huge_context_is_refused_by_serve_before_allocating(tmp_path, max_seq_len):
    model = model_variant(tmp_path, "long", max_seq_len=max_seq_len)
    code, stderr, rss = run_measured("serve", "--model", str(model), "--host", "127.0.0.1",
                                     "--port", "0", "--metrics-port", "0")
    assert code == 1, stderr
    assert "KV cache" in stderr and f"max_seq_len {max_seq_len}" in stderr, stderr
    assert rss < MAX_RSS_KB


@pytest.mark.parametrize("max_seq_len", [10**6, 2**31 - 1])
def test_offline_commands_size_the_cache_to_the_input(tmp_path, max_seq_len):
    model = model_variant(tmp_path, "long", max_seq_len=max_seq_len)
    code, stderr, rss = run_measured("generate", "--model", str(model), "--prompt", "In the",
                                     "--max-new-tokens", "4")
    assert code == 0, stderr
    assert rss < MAX_RSS_KB
    code, stderr, rss = run_measured("score", "--model", str(model), "--tokens", "73,110,32")
    assert code == 0, stderr
    assert rss < MAX_RSS_KB


def host_memory_bytes():
    with open("/proc/meminfo") as meminfo:
        for line in meminfo:
            if line.startswith("MemTotal:"):
                return int(line.split()[1]) * 1024
    pytest.fail("no MemTotal in /proc/meminfo")


@pytest.mark.parametrize("why", ["more than the host", "more than 2^31 blocks"])
def test_kv_cache_beyond_limits_is_refused(why):
    # The built-in model: 2048 bytes of KV per token, contexts of 256 tokens.
    if why == "more than the host":
        running = 2 * host_memory_bytes() // (2048 * 256) + 1
        expected = "host's memory"
    else:
        running = 2**31 - 1
        expected = "block ids"
    code, stderr, rss = run_measured("serve", "--host", "127.0.0.1", "--port", "0",
                                     "--metrics-port", "0", "--kv-cache-bytes", str(2**62),
                                     "--max-running-requests", str(running))
    assert code == 1, stderr
    assert expected in stderr, stderr
    assert rss < MAX_RSS_KB


# The built-in model's context is 256 tokens: 37 blocks of 7, 2 of 200, 1 of 1024.
@pytest.mark.parametrize("block_size, running, blocks", [(16, 8, 8 * 16), (7, 8, 8 * 37),
                                                         (200, 8, 8 * 2), (1024, 64, 64)])
def test_the_kv_cache_holds_max_running_requests_full_contexts(block_size, running, blocks):
    """With a budget to spare, the cache holds --max-running-requests full
    contexts in whole blocks: capped at that many contexts' tokens instead,
    a block size that does not divide the context left too few blocks (296
    needed, 293 made at 7), and one larger than it ran 16 requests at once
    of 64 (--kv-block-size 1024: 16 blocks)."""
    import generation_pb2 as pb
    import generation_pb2_grpc as pb_grpc
    from server_process import ServerProcess
    server = ServerProcess(BINARY, DEFAULT_MODEL, "--kv-block-size", str(block_size),
                           "--max-running-requests", str(running))
    try:
        assert f"KV cache {blocks} blocks x {block_size} tokens" in server.log(), server.log()
        with server.channel() as channel:
            cache = pb_grpc.GenerationStub(channel).GetModelInfo(pb.GetModelInfoRequest()).cache
        assert (cache.total_blocks, cache.block_size) == (blocks, block_size)
    finally:
        server.close()


def test_score_refuses_a_context_of_one(tmp_path):
    model = model_variant(tmp_path, "short", max_seq_len=1)
    code, stderr, _ = run_measured("score", "--model", str(model), "--tokens", "73,110,32",
                                   timeout=20)
    assert code == 1 and "max_seq_len 1" in stderr, stderr


@pytest.mark.parametrize("flags", [["--temperature", "1e300"], ["--temperature", "nan"],
                                   ["--temperature", "-1"], ["--top-p", "2"],
                                   ["--top-p", "nan"], ["--top-k", "-1"],
                                   ["--max-new-tokens", "-1"]])
def test_generate_refuses_sampling_flags_out_of_range(flags):
    code, stderr, _ = run_measured("generate", "--prompt", "In the", *flags, timeout=20)
    assert code == 2, stderr
    # The message names the flag that is out of range, and no other.
    others = {"--temperature", "--top-p", "--top-k", "--max-new-tokens"} - {flags[0]}
    assert flags[0] in stderr and not any(other in stderr for other in others), stderr


@pytest.mark.parametrize("value", ["nan", "-1"])
def test_health_refuses_a_bad_timeout(value):
    code, stderr, _ = run_measured("health", "--address", "127.0.0.1:1", "--timeout-s", value,
                                   timeout=20)
    assert code == 2 and "--timeout-s" in stderr, stderr


# A probe meant for mTLS or a named TLS server must not pass over plaintext:
# --tls-key without --tls-cert, and --tls-server-name without TLS, were
# accepted and ignored (SERVING from a plaintext server).
@pytest.mark.parametrize("args, expected", [
    (["--tls-key", "/nonexistent/key.pem"], "--tls-cert and --tls-key go together"),
    (["--tls-server-name", "wrong.example"], "--tls-server-name needs TLS"),
])
def test_health_refuses_tls_flags_that_would_be_ignored(args, expected):
    code, stderr, _ = run_measured("health", "--address", "127.0.0.1:1", *args, timeout=20)
    assert code == 2 and expected in stderr, stderr


# absl's flags are process-wide and it drops stray words: each subcommand
# checks its arguments first (server/commands.h, ArgumentProblem).
@pytest.mark.parametrize("args, expected", [
    # Without this check the flag was on and "false" was dropped.
    (["generate", "--prompt", "x", "--allow-non-finite-weights", "false"],
     'unexpected argument "false" (a boolean flag takes its value after "=": '
     "--allow-non-finite-weights=false)"),
    (["generate", "--prompt", "x", "foo"], 'unexpected argument "foo"'),
    (["generate", "--prompt", "x", "--", "foo"], 'unexpected argument "foo"'),
    (["score", "--tokens", "1,2", "--port", "1"],
     "--port is not a flag of this subcommand (`switchserve score --help` lists them)"),
    (["health", "--model", "x"], "--model is not a flag of this subcommand"),
    (["generate", "--prompt", "x", "--no-such-flag", "1"], "unknown flag --no-such-flag"),
])
def test_arguments_another_subcommand_or_nobody_takes_are_refused(args, expected):
    code, stderr, _ = run_measured(*args, timeout=20)
    assert code == 2, stderr
    assert f"switchserve {args[0]}: {expected}" in stderr, stderr


# absl's parser exited 1 on a value its flag cannot hold, which `health`
# documents as "the server answered, not SERVING"; each is refused like any
# other bad argument, naming the flag as typed.
@pytest.mark.parametrize("args, expected", [
    (["health", "--address", "127.0.0.1:1", "--timeout-s", "abc"], '--timeout-s: not a number: "abc"'),
    (["health", "--tls=maybe"], '--tls: not true or false: "maybe"'),
    (["serve", "--port=99999999999999999999"],
     '--port: not a 32-bit integer: "99999999999999999999"'),
    (["serve", "--kv-cache-bytes="], '--kv-cache-bytes: not a 64-bit integer: ""'),
    (["serve", "--noreflection=false"], "--noreflection takes no value (--reflection=false)"),
    (["generate", "--prompt", "x", "--max-new-tokens", "1.5"],
     '--max-new-tokens: not a 32-bit integer: "1.5"'),
    (["generate", "--prompt", "x", "--capacity-factor", "x"],
     '--capacity-factor: not a number (or empty: the model\'s): "x"'),
    (["score", "--tokens", "1,2", "--threads"], "--threads needs a value"),
])
def test_values_a_flag_cannot_hold_are_refused_with_exit_code_2(args, expected):
    code, stderr, _ = run_measured(*args, timeout=20)
    assert code == 2, stderr
    assert f"switchserve {args[0]}: {expected}" in stderr, stderr


def test_flag_spellings_that_are_accepted():
    """--flag value, --flag=value, -flag, --noflag for a boolean."""
    code, stderr, _ = run_measured("generate", "-prompt", "In", "--max-new-tokens=2", "--seed", "3",
                                   "--noallow_non_finite_weights", "--allow-non-finite-weights=false",
                                   timeout=60)
    assert code == 0, stderr


# absl reads --flagfile and --fromenv itself: a flagfile it could not open, a
# line or a flag in it that it refused, ended the process with absl's own
# line ("ERROR: Can't open flagfile ...") and exit code 1, which `health`
# means for a server that answered and is not SERVING; a flag in it of
# another subcommand was taken without a word. What they hold is checked as
# the command line is, the problem naming the flagfile.
HEALTH = ["health", "--address", "127.0.0.1:1"]


@pytest.mark.parametrize("command, lines, expected", [
    (["serve"], None, "cannot read: No such file or directory"),
    (["serve"], "directory", "cannot read: Is a directory"),
    (["serve"], ["--bogus=1"], "unknown flag --bogus (`switchserve serve --help` lists them)"),
    (["serve"], ["# settings", "", "  --port=abc"], '--port: not a 32-bit integer: "abc"'),
    (["serve"], ["--prompt=x"], "--prompt is not a flag of this subcommand"),
    (["serve"], ["--port=0", "port=5"],
     'line 2: "port=5" is not a flag (one a line: --name=value)'),
    (["serve"], ["--"], 'line 1: "--" is not a flag'),
    (["serve"], ["--max-batch-tokens=5"],
     "--max-batch-tokens: a flagfile spells its flags with underscores (--max_batch_tokens)"),
    (["serve"], ["--flagfile=PATH"], "is read again inside itself"),
    (HEALTH, None, "cannot read: No such file or directory"),
    (HEALTH, ["--timeout_s=abc"], '--timeout_s: not a number: "abc"'),
    (HEALTH, ["--tls\r"], "--tls: whitespace after the name (\\r; a Windows line ending?)"),
])
def test_flagfile_problems_are_refused_with_exit_code_2(tmp_path, command, lines, expected):
    path = tmp_path / "flags"
    if lines == "directory":
        path.mkdir()
    elif lines is not None:
        path.write_text("".join(line.replace("PATH", str(path)) + "\n" for line in lines))
    # After the flagfile, whose flags absl sets where it is named: a server
    # that started despite it would take ports of no one else's.
    ports = ["--port", "0", "--metrics-port", "0"] if command[0] == "serve" else []
    code, stderr, _ = run_measured(*command, f"--flagfile={path}", *ports, timeout=20)
    assert code == 2, stderr
    assert stderr.startswith(f'switchserve {command[0]}: --flagfile "{path}": '), stderr
    assert expected in stderr, stderr


@pytest.mark.parametrize("command, flag, expected", [
    (["health"], "--address=127.0.0.1:1", "127.0.0.1:1: failed to connect"),
    (["serve", "--model", "/nonexistent", "--port", "0", "--metrics-port", "0"],
     "--auth_token_file=/nonexistent/token", "/nonexistent/token"),
])
def test_a_flagfile_read_from_a_pipe_keeps_its_flags(command, flag, expected):
    """A pipe can be read once: the argument check read it first, and absl
    then found it empty; the flags were dropped without a word (a server
    without its --auth-token-file)."""
    output = subprocess.run([BINARY, *command, "--flagfile=/dev/stdin"], input=flag + "\n",
                            capture_output=True, text=True, timeout=30)
    assert output.returncode != 0, output.stderr
    assert expected in output.stderr, output.stderr


def test_undefok_in_a_flagfile_lets_its_unknown_flags_pass(tmp_path):
    """absl drops an unknown flag that --undefok names, from a flagfile too
    (one flagfile shared by versions that know different flags)."""
    path = tmp_path / "flags"
    path.write_text("--undefok=retired_flag\n--retired_flag=1\n--noretired_flag\n"
                    "--address=127.0.0.1:1\n")
    code, stderr, _ = run_measured("health", f"--flagfile={path}", timeout=20)
    assert "127.0.0.1:1: failed to connect" in stderr, stderr
    path.write_text("--retired_flag=1\n--address=127.0.0.1:1\n")
    code, stderr, _ = run_measured("health", f"--flagfile={path}", timeout=20)
    assert code == 2 and "unknown flag --retired_flag" in stderr, stderr


def test_flagfiles_in_a_loop_or_nested_too_deep_are_refused_once(tmp_path):
    """A loop of flagfiles is named once round (it was refused only at 8
    deep, its names repeated nine times); a chain of nine is refused at 8."""
    a, b = tmp_path / "a", tmp_path / "b"
    a.write_text(f"--flagfile={b}\n")
    b.write_text(f"--flagfile={a}\n")
    code, stderr, _ = run_measured("serve", f"--flagfile={a}", "--port", "0", "--metrics-port", "0",
                                   timeout=20)
    assert code == 2, stderr
    assert stderr.strip() == (f'switchserve serve: --flagfile "{a}": --flagfile "{b}": '
                              f'--flagfile "{a}": is read again inside itself '
                              "(flagfiles that include each other)"), stderr
    chain = [tmp_path / f"d{i}" for i in range(10)]
    for here, there in zip(chain, chain[1:]):
        here.write_text(f"--flagfile={there}\n")
    chain[-1].write_text("--port=0\n")
    code, stderr, _ = run_measured("serve", f"--flagfile={chain[0]}", "--port", "0",
                                   "--metrics-port", "0", timeout=20)
    assert code == 2, stderr
    assert stderr.strip().endswith(f'--flagfile "{chain[8]}": flagfiles nested more than 8 deep'), \
        stderr
    # The same flagfile twice side by side is no loop: the flags pass, and
    # `health` goes on to ask the server.
    chain[-1].write_text("--timeout_s=1\n")
    code, stderr, _ = run_measured("health", f"--flagfile={chain[-1]},{chain[-1]}",
                                   "--address", "127.0.0.1:1", timeout=20)
    assert "failed to connect" in stderr, stderr


@pytest.mark.parametrize("value, expected", [
    (None, "--fromenv: FLAGS_port is not set"),
    ("abc", '--fromenv: --port: not a 32-bit integer: "abc"'),
])
def test_fromenv_problems_are_refused_with_exit_code_2(monkeypatch, value, expected):
    monkeypatch.delenv("FLAGS_port", raising=False)
    if value is not None:
        monkeypatch.setenv("FLAGS_port", value)
    code, stderr, _ = run_measured("serve", "--fromenv=port", "--metrics-port", "0", timeout=20)
    assert code == 2, stderr
    assert f"switchserve serve: {expected}" in stderr, stderr


def test_a_flagfile_sets_its_flags(tmp_path):
    """Read with --flagfile=FILE or --flagfile FILE (which was refused as a
    stray word), its flags act as on the command line."""
    path = tmp_path / "flags"
    path.write_text("# generate\n--prompt=In\n\n  --max_new_tokens=3\n--seed=3\n--temperature=1\n")
    outputs = [subprocess.run([BINARY, "generate", *args], capture_output=True, text=True,
                              timeout=60)
               for args in (["--flagfile", str(path)], [f"--flagfile={path}"],
                            ["--prompt", "In", "--max-new-tokens", "3", "--seed", "3",
                             "--temperature", "1"])]
    for output in outputs:
        assert output.returncode == 0, output.stderr
    assert outputs[0].stdout == outputs[1].stdout == outputs[2].stdout
    assert outputs[2].stdout != subprocess.run(
        [BINARY, "generate", "--prompt", "In", "--max-new-tokens", "3", "--seed", "4",
         "--temperature", "1"], capture_output=True, text=True, timeout=60).stdout


@pytest.mark.parametrize("command", [["generate", "--prompt", "x"], ["score", "--tokens", "1,2"],
                                     ["serve", "--port", "0"]])
@pytest.mark.parametrize("threads", ["-1", "1025", "100000"])
def test_threads_out_of_range_are_refused_before_starting_them(command, threads):
    code, stderr, rss = run_measured(*command, "--threads", threads, timeout=20)
    assert code in (1, 2), stderr
    assert f"--threads: must be in [0, 1024] (0: all cores), found {threads}" in stderr, stderr
    assert rss < MAX_RSS_KB


@pytest.mark.parametrize("text, expected", [
    ("/dev/zero", "--text /dev/zero: not a regular file"),  # read without end before
    ("DIR", "not a regular file"),
    ("EMPTY", "need at least 2 tokens, found 0"),  # "pos > size()" before
])
def test_score_text_must_be_a_file_of_two_tokens(tmp_path, text, expected):
    if text == "DIR":
        text = str(tmp_path)
    elif text == "EMPTY":
        text = str(tmp_path / "empty.txt")
        pathlib.Path(text).write_text("")
    code, stderr, rss = run_measured("score", "--text", text, timeout=20)
    assert code == 1, stderr
    assert expected in stderr, stderr
    assert rss < MAX_RSS_KB


@pytest.mark.parametrize("command", [["generate", "--prompt", "x"], ["score", "--tokens", "1,2"]])
def test_offline_kv_block_size_out_of_range_is_refused(command):
    code, stderr, _ = run_measured(*command, "--kv-block-size", "0", timeout=20)
    assert code == 1, stderr
    assert "--kv-block-size: must be in [1, 1024], found 0" in stderr, stderr


def test_score_tokens_must_be_two_or_more():
    code, stderr, _ = run_measured("score", "--tokens", "73", timeout=20)
    assert code == 1, stderr
    assert "--tokens: need at least 2 tokens, found 1" in stderr, stderr


@pytest.mark.parametrize("address, expected", [
    ("localhost:70000", 'the port must be in [1, 65535], found "70000"'),  # dialled 4464 before
    ("localhost:-1", 'the port must be in [1, 65535], found "-1"'),
    ("localhost", 'no port in "localhost"'),  # dialled 443 before
    ("::1:50051", "an IPv6 address goes in brackets"),
    ("999.1.1.1:50051", 'not an IPv4 or IPv6 address or a host name: "999.1.1.1"'),
])
def test_health_refuses_an_address_that_is_not_host_and_port(address, expected):
    code, stderr, _ = run_measured("health", "--address", address, timeout=20)
    assert code == 2, stderr
    assert f"--address: {expected}" in stderr, stderr


@pytest.mark.parametrize("flag", ["--host", "--metrics-host"])
def test_serve_refuses_an_address_that_is_no_address(flag):
    # civetweb read "999.1.1.1" as 231.1.1.1 and listened there.
    code, stderr, _ = run_measured("serve", flag, "999.1.1.1", "--port", "0", timeout=20)
    assert code == 2, stderr
    assert f'{flag}: not an IPv4 or IPv6 address or a host name: "999.1.1.1"' in stderr, stderr


# Two listeners on one port of one address: the second bind failed after the
# model loaded (exit 1), blaming "address already in use", and with the
# metrics port it was gRPC's listener that took the blame.
@pytest.mark.parametrize("args, expected", [
    (["--port", "52399", "--http-port", "52399"], "--http-port: 52399 is --port's too"),
    (["--port", "52399", "--metrics-port", "52399"], "--metrics-port: 52399 is --port's too"),
    (["--port", "0", "--http-port", "9090"], "--metrics-port: 9090 is --http-port's too"),
    (["--host", "::", "--port", "52399", "--metrics-host", "127.0.0.1", "--metrics-port", "52399"],
     "--metrics-port: 52399 is --port's too"),
])
def test_serve_refuses_one_port_for_two_listeners(args, expected):
    code, stderr, _ = run_measured("serve", *args, timeout=20)
    assert code == 2, stderr
    assert f"switchserve serve: {expected}" in stderr, stderr

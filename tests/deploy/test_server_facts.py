"""The flag reader the other deployment tests take the server's ports from."""
import server_facts


def test_parses_absl_flag_defaults():
    source = '''
ABSL_FLAG(uint16_t, port, 50051, "gRPC port");
ABSL_FLAG(int32_t, metrics_port, int32_t{9090},
          "Prometheus port");
ABSL_FLAG(std::string, host, "0.0.0.0", "listen address");
ABSL_FLAG(absl::Duration, grace, absl::Seconds(30), "x, y");
'''
    flags = server_facts.parse_absl_flags(source)
    assert flags == {"port": 50051, "metrics_port": 9090, "host": "0.0.0.0",
                     "grace": "absl::Seconds(30)"}


def test_source_flags_override_the_fallback(tmp_path, monkeypatch):
    (tmp_path / "server").mkdir()
    (tmp_path / "server" / "serve_flags.cc").write_text(
        'ABSL_FLAG(int, port, 6000, "gRPC port");\n')
    monkeypatch.setattr(server_facts, "REPO_ROOT", tmp_path)
    assert server_facts.grpc_port() == 6000
    assert server_facts.metrics_port() == server_facts.FALLBACK_FLAGS["metrics_port"]
    assert server_facts.known_flag_names() == {"port"}


def test_generation_service_from_the_proto(tmp_path, monkeypatch):
    (tmp_path / "proto").mkdir()
    (tmp_path / "proto" / "api.proto").write_text(
        'syntax = "proto3";\npackage switchserve.v2;\nservice Generation {}\n')
    monkeypatch.setattr(server_facts, "REPO_ROOT", tmp_path)
    assert server_facts.generation_service() == "switchserve.v2.Generation"


def test_cli_flags():
    assert server_facts.parse_cli_flags(["--port=1", "--metrics-port", "2", "--x"]) == {
        "port": "1", "metrics_port": "2", "x": "true"}

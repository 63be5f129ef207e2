"""What the deployment files must agree with about the server: the one place.

Flag defaults come from the server's source (`ABSL_FLAG(type, name, default,
help)` in server/**/*.cc) when it defines them, else from FALLBACK_FLAGS, the
values the server's interface was specified with. The gRPC service name comes
from proto/**/*.proto when present.
"""
import pathlib
import re

REPO_ROOT = pathlib.Path(__file__).resolve().parents[2]

# Flags of `switchserve serve` and their defaults, as specified for the server.
FALLBACK_FLAGS = {
    "model": None,  # default: the built-in model in the source tree
    "host": "0.0.0.0",
    "port": 50051,
    "metrics_port": 9090,
    "device": "cpu",
    "kv_cache_bytes": None,
    "drain_timeout_s": 30,
    "tls_cert": "",
    "tls_key": "",
    "tls_client_ca": "",
    "auth_token_file": "",
}
DEVICES = {"cpu", "cuda", "auto"}
FALLBACK_GENERATION_SERVICE = "switchserve.v1.Generation"
HEALTH_SERVICE = "grpc.health.v1.Health"
# Inside the images (deploy/docker/Dockerfile*).
IMAGE_MODEL_DIR = "/opt/switchserve/models/default"
BINARY = "switchserve"

_ABSL_FLAG = re.compile(r"ABSL_FLAG\(\s*([^,]+?)\s*,\s*(\w+)\s*,\s*(.+?)\s*,\s*\"", re.S)


def parse_absl_flags(source: str) -> dict:
    """{name: default} for every ABSL_FLAG in `source`. Integer and string
    literals become int / str; any other default expression stays a string."""
    flags = {}
    for match in _ABSL_FLAG.finditer(source):
        _type, name, default = match.groups()
        default = default.strip()
        # 50051, int32_t{50051}, "0.0.0.0", std::string{"x"}; other calls stay text
        inner = re.fullmatch(r"[\w:]+\s*\{\s*(.*?)\s*\}", default)
        if inner:
            default = inner.group(1)
        if re.fullmatch(r"-?\d+", default):
            flags[name] = int(default)
        elif re.fullmatch(r'"[^"]*"', default):
            flags[name] = default[1:-1]
        else:
            flags[name] = default
    return flags


def _server_sources():
    server = REPO_ROOT / "server"
    if not server.is_dir():
        return []
    return sorted(p for p in server.rglob("*") if p.suffix in (".cc", ".h"))


def source_flags() -> dict:
    """Flags the server's source defines (empty until it defines any)."""
    flags = {}
    for path in _server_sources():
        flags.update(parse_absl_flags(path.read_text(errors="replace")))
    return flags


def server_flags() -> dict:
    """Flag name -> default: the source's where defined, else the fallback."""
    flags = dict(FALLBACK_FLAGS)
    flags.update(source_flags())
    return flags


def known_flag_names() -> set:
    """Flags `serve` accepts: the source's set once it defines flags."""
    defined = source_flags()
    return set(defined) if defined else set(FALLBACK_FLAGS)


def generation_service() -> str:
    for proto in sorted((REPO_ROOT / "proto").rglob("*.proto")) if (REPO_ROOT / "proto").is_dir() else []:
        text = proto.read_text(errors="replace")
        package = re.search(r"^\s*package\s+([\w.]+)\s*;", text, re.M)
        if package and re.search(r"^\s*service\s+Generation\b", text, re.M):
            return f"{package.group(1)}.Generation"
    return FALLBACK_GENERATION_SERVICE


def grpc_port() -> int:
    return int(server_flags()["port"])


def metrics_port() -> int:
    return int(server_flags()["metrics_port"])


def drain_timeout_s() -> int:
    return int(server_flags()["drain_timeout_s"])


def parse_cli_flags(args) -> dict:
    """`--name=value` / `--name value` arguments -> {name_with_underscores: value}."""
    flags, i = {}, 0
    args = list(args)
    while i < len(args):
        arg = args[i]
        if arg.startswith("--"):
            if "=" in arg:
                name, value = arg[2:].split("=", 1)
            elif i + 1 < len(args) and not args[i + 1].startswith("--"):
                name, value = arg[2:], args[i + 1]
                i += 1
            else:
                name, value = arg[2:], "true"
            flags[name.replace("-", "_")] = value
        i += 1
    return flags

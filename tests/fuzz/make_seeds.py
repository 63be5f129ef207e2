#!/usr/bin/python3
"""Writes the generated seeds of tests/fuzz/corpus/ (the safetensors files,
the serialized GenerateRequests, the HTTP connections, the logprobs inputs and
the model directories); the text seeds are committed as they are.
Needs protoc, grpc_python_plugin, Debian's python3-protobuf and python3-torch
(the model directories' tensor lists come from tools/reference).
  /usr/bin/python3 tests/fuzz/make_seeds.py
"""
import json
import pathlib
import struct
import subprocess
import sys
import tempfile

HERE = pathlib.Path(__file__).resolve().parent
ROOT = HERE.parents[1]
CORPUS = HERE / "corpus"


def safetensors(tensors, metadata=None):
    header, data = {}, b""
    if metadata is not None:
        header["__metadata__"] = metadata
    for name, (dtype, shape, raw) in tensors.items():
        header[name] = {"dtype": dtype, "shape": shape,
                        "data_offsets": [len(data), len(data) + len(raw)]}
        data += raw
    text = json.dumps(header).encode()
    return struct.pack("<Q", len(text)) + text + data


def write_safetensors_seeds():
    out = CORPUS / "safetensors_fuzz"
    (out / "f32_matrix").write_bytes(
        safetensors({"w": ("F32", [2, 3], struct.pack("<6f", 1, -2, 3.5, 0, 1e-3, 7))}))
    (out / "mixed_dtypes").write_bytes(safetensors({
        "a": ("F16", [4], struct.pack("<4H", 0x3c00, 0xbc00, 0x7c00, 0x0001)),
        "b": ("BF16", [2, 1], struct.pack("<2H", 0x3f80, 0x7fc0)),
        "c": ("I64", [1], struct.pack("<q", 42)),
        "empty": ("F32", [0, 5], b""),
        "scalar": ("F32", [], struct.pack("<f", 2.0))}, metadata={"format": "pt"}))
    (out / "truncated").write_bytes(
        safetensors({"w": ("F32", [4], struct.pack("<4f", 1, 2, 3, 4))})[:-3])


def write_request_seeds():
    with tempfile.TemporaryDirectory() as stubs:
        subprocess.run(["protoc", f"-I{ROOT}/proto", f"--python_out={stubs}",
                        "switchserve/v1/generation.proto"], check=True)
        sys.path.insert(0, stubs)
        from switchserve.v1 import generation_pb2 as pb
        requests = {
            "text_greedy": pb.GenerateRequest(
                text="In the beginning",
                sampling=pb.SamplingParams(max_new_tokens=8, temperature=0)),
            "tokens_sampling": pb.GenerateRequest(
                token_ids=pb.TokenIds(ids=[1, 2, 3, 250]),
                sampling=pb.SamplingParams(
                    max_new_tokens=4, temperature=0.7, top_k=40, top_p=0.9, min_p=0.05,
                    repetition_penalty=1.2, seed=7, stop=["\n", "end"], stop_token_ids=[10],
                    ignore_eos=True),
                logprobs=3, return_routing=True),
            "penalty_edge": pb.GenerateRequest(
                text="x", sampling=pb.SamplingParams(repetition_penalty=0.01, temperature=1e-30)),
            "penalties_bias": pb.GenerateRequest(
                text="abcabc", sampling=pb.SamplingParams(
                    temperature=0.9, presence_penalty=-2.0, frequency_penalty=1.5,
                    logit_bias={97: -100.0, 98: 100.0, 255: 0.5})),
            "bad_words_allowed": pb.GenerateRequest(
                text="abcab", sampling=pb.SamplingParams(
                    temperature=3.0e38, bad_words=["bc", " c", "a"],
                    allowed_token_ids=[97, 98, 99, 98], min_tokens=1)),
        }
        for name, request in requests.items():
            (CORPUS / "generate_request_fuzz" / name).write_bytes(request.SerializeToString())


# --- http_request_fuzz: three bytes (kind, read size, body limit), then the
# connection's bytes (raw) or a description of its requests (structured), in
# the order http_request_fuzz.cc reads them.

BODY_LIMITS = [0, 1, 10, 100, 1000, 5000, 65536, 4 << 20]
PATH = "abcdefghijklmnopqrstuvwxyzABCDEFGHIJKLMNOPQRSTUVWXYZ0123456789-._~!$&'()*+,;=:@/?%"
TOKEN = "abcdefghijklmnopqrstuvwxyzABCDEFGHIJKLMNOPQRSTUVWXYZ0123456789!#$%&'*+-.^_`|~"
AUTHORITY = "abcdefghijklmnopqrstuvwxyz0123456789.-:@[]"
METHODS = ["GET", "POST", "HEAD", "PUT", "PATCH", "OPTIONS", "DELETE", "M-SEARCH"]


def repeat(byte, count):
    """Raw kind: the byte `count` times."""
    return b"\xff\xff" + struct.pack("<H", count) + byte


def http_raw(data, piece=0, limit=BODY_LIMITS.index(4 << 20)):
    return bytes([0, piece, limit]) + data


def text(value, alphabet=None):
    raw = value if alphabet is None else bytes(alphabet.index(c) for c in value)
    return bytes([len(raw)]) + raw


def http_request(http11=True, method="GET", path="", path_fill=0, target="origin", rest="",
                 query="", scheme=0, authority="", host="x", extra=(), fill=0, expect=0,
                 connection=0, body=b"", body_fill=0, chunked=0, other=0, framing=0,
                 framing_at=0, chunks=(), last_ext=0, trailer=None):
    """One structured request. target: "origin", "absolute" (rest "", "path" or
    "query") or "*"; host None: no Host; extra: (name, value bytes) pairs;
    framing: http_request_fuzz.cc's case number; chunks: (size, extension)."""
    out = bytes([int(http11), METHODS.index(method)]) + text(path, PATH)
    out += struct.pack("<H", path_fill)
    out += bytes([{"origin": 0, "absolute": 2, "*": 3}[target]])
    if target == "absolute":
        out += bytes([{"": 0, "path": 1, "query": 2}[rest]])
        if rest == "query":
            out += text(query, PATH)
        out += bytes([scheme]) + text(authority, AUTHORITY)
    out += bytes([0]) if host is None else bytes([1]) + text(host, AUTHORITY)
    out += bytes([len(extra)])
    for name, value in extra:
        out += text(name, TOKEN) + bytes([len(value)]) + value
    out += struct.pack("<H", fill) + bytes([expect, connection]) + text(body)
    out += struct.pack("<H", body_fill) + bytes([chunked, other, framing, framing_at])
    if framing == 2:
        for size, extension in chunks:
            out += bytes([size, extension, 0, 0])
        out += bytes([last_ext])
        out += bytes([0]) if trailer is None else bytes([1]) + text(trailer, TOKEN)
    return out


def http_structured(requests, piece=0, limit=BODY_LIMITS.index(4 << 20)):
    return bytes([1, piece, limit, len(requests) - 1]) + b"".join(requests)


def write_http_seeds():
    out = CORPUS / "http_request_fuzz"
    seeds = {
        "raw_pipelined": http_raw(
            b"GET /health HTTP/1.1\r\nHost: x\r\n\r\n"
            b"POST /v1/completions HTTP/1.1\r\nHost: x\r\nContent-Length: 5\r\n\r\nhello"
            b"GET /v1/models HTTP/1.1\r\nHost: x\r\nConnection: close\r\n\r\n"),
        "raw_chunked_trailer": http_raw(
            b"POST /v1/completions HTTP/1.1\r\nHost: x\r\nTransfer-Encoding: chunked\r\n"
            b"Expect: 100-continue\r\n\r\n5;a=b\r\nhello\r\n0\r\nX-T: 1\r\n\r\n", piece=3),
        "raw_http10_absolute": http_raw(
            b"POST http://127.0.0.1:8000/v1/completions?x=1 HTTP/1.0\r\nExpect: 100-continue\r\n"
            b"Connection: keep-alive\r\nContent-Length: 2\r\n\r\n{}"),
        "raw_refusals": http_raw(
            b"GET / HTTP/1.1\r\nHost: x\r\nTransfer-Encoding: gzip\r\nContent-Length: 1\r\n\r\nx"),
        "raw_no_host": http_raw(b"GET /health HTTP/1.1\r\nExpect: x\r\n\r\n"),
        "raw_head_over_8k": http_raw(
            b"GET /health HTTP/1.1\r\nHost: x\r\nX-Big: " + repeat(b"b", 8200) + b"\r\n\r\n"),
        "raw_head_8k_split": http_raw(
            b"GET /" + repeat(b"q", 5000) + b" HTTP/1.1\r\nHost: x\r\nX-Big: " + repeat(b"b", 5000)
            + b"\r\n\r\n"),
        "raw_chunk_extension_over_64k": http_raw(
            b"POST / HTTP/1.1\r\nHost: x\r\nTransfer-Encoding: chunked\r\n\r\n1;"
            + repeat(b"e", 65535) + repeat(b"e", 5000) + b"\r\nx\r\n0\r\n\r\n"),
        "raw_body_over_limit": http_raw(
            b"POST / HTTP/1.1\r\nHost: x\r\nContent-Length: 20\r\n\r\n" + b"b" * 20,
            limit=BODY_LIMITS.index(10)),
        "pipelined_keep_alive": http_structured([
            http_request(path="health"),
            http_request(method="POST", target="absolute", rest="path", path="v1/completions",
                         authority="127.0.0.1:8000", scheme=3, body=b"{\"prompt\": \"x\"}",
                         framing=1, framing_at=1, extra=[("X-Request-Id", b" abc \t")]),
            http_request(http11=False, method="HEAD", target="absolute", rest="query",
                         query="a=1", host=None, connection=2)]),
        "chunked_trailer_duplicate_fields": http_structured([http_request(
            method="POST", path="v1/completions", expect=2, body=b"0123456789abcdef",
            extra=[("X", b"1"), ("Accept", b"\x80\xff obs-text"), ("x", b"2")],
            chunked=1, framing=2, framing_at=2, chunks=[(3, 1), (5, 2), (0, 0)],
            trailer="done")]),
        "chunks_over_limit": http_structured([http_request(
            method="POST", body=b"b" * 40, framing=2, chunks=[(8, 0), (0, 0)])],
            limit=BODY_LIMITS.index(10)),
        "length_then_chunked": http_structured([http_request(method="POST", body=b"xy",
                                                             framing=5)]),
        "gzip_then_length": http_structured([http_request(method="POST", body=b"xy", framing=4)]),
    }
    # Heads of exactly 8192 bytes (served) and 8193 (431) with a short request
    # line, read at once and byte by byte: "GET /p HTTP/1.1", Host, X-Fill.
    fixed = len(b"GET / HTTP/1.1\r\nHost: x\r\nX-Fill: \r\n\r\n")
    for total, name in ((8192, "head_8192"), (8193, "head_8193")):
        for piece, how in ((0, "at_once"), (1, "byte_by_byte")):
            seeds[f"{name}_{how}"] = http_structured([http_request(fill=total - fixed)], piece=piece)
    for name, data in seeds.items():
        (out / name).write_bytes(data)


# --- logprobs_fuzz: top_n, flags (1: names as ids, 2: the SentencePiece test
# model, 4: the pieces that follow; (flags >> 3) % 3: the text ends open, after
# the last token or before it), then tokens: id (16 bits), logprob byte (255:
# -inf, 254: NaN, else -b/8), shape (alternatives % 6; 0x80: an event ends),
# alternatives (id, logprob byte).

AFTER_LAST, BEFORE_LAST = 1 << 3, 2 << 3

def logprob_token(token_id, logprob, alternatives=(), event_end=False):
    out = struct.pack("<HBB", token_id, logprob, len(alternatives) | (0x80 if event_end else 0))
    for alt_id, alt_logprob in alternatives:
        out += struct.pack("<HB", alt_id, alt_logprob)
    return out


def write_logprobs_seeds():
    out = CORPUS / "logprobs_fuzz"
    pieces = [b"\xe2\x82", b"\xac", b" h\xc3", b"\xa9llo", b"\xff", b"ok", b" \xf0\x9f\x98\x80", b""]
    vocabulary = bytes([len(pieces) - 1]) + b"".join(bytes([len(p)]) + p for p in pieces)
    tokens = [logprob_token(2, 3, [(2, 3), (3, 9), (9, 20)], True),  # 9: past the pieces
              logprob_token(3, 255, [(0, 1), (0, 2), (4, 254)]),
              logprob_token(0, 254, [(1, 0)], True),
              logprob_token(1, 0, [(6, 1), (5, 2), (7, 3), (4, 4), (2, 5)]),
              logprob_token(6, 7), logprob_token(4, 40, [], True), logprob_token(0, 1)]
    (out / "pieces_broken_utf8").write_bytes(bytes([5, 4]) + vocabulary + b"".join(tokens))
    (out / "pieces_as_ids").write_bytes(bytes([20, 5]) + vocabulary + b"".join(tokens))
    # "h", an unfinished character, then tokens that spell nothing (ids past
    # the pieces), the last an EOS left out of the text; and the same text
    # ending after its last token, broken by "ok".
    unfinished = [logprob_token(2, 1), logprob_token(9, 2, [], True), logprob_token(10, 3),
                  logprob_token(8, 4)]
    (out / "pieces_unfinished_before_eos").write_bytes(
        bytes([1, 4 | BEFORE_LAST]) + vocabulary + b"".join(unfinished))
    (out / "pieces_unfinished_broken_at_end").write_bytes(
        bytes([1, 4 | AFTER_LAST]) + vocabulary + b"".join(unfinished + [logprob_token(5, 5)]))
    euro = [logprob_token(b, 8, [(b, 8), (b ^ 1, 16)], i == 1) for i, b in enumerate(b"\xe2\x82\xac")]
    broken = [logprob_token(b, 8, [(0xc3, 9)]) for b in b"a\xff\xc3(\xe2\x82"]
    (out / "byte_tokenizer").write_bytes(bytes([2, 0]) + b"".join(euro + broken))
    # SentencePiece ids: pieces, byte-fallback pieces, past the model.
    spm = [logprob_token(i, (4 * i) % 250, [(i, 1), (i + 1, 2)], i % 3 == 0)
           for i in (5, 40, 3 + 0xe2, 3 + 0x82, 3 + 0xac, 3 + 0xff, 299, 1, 0)]
    (out / "sentencepiece_byte_fallback").write_bytes(bytes([3, 2]) + b"".join(spm))


# --- model_directory_fuzz: the options byte (weights dtype: 0 auto, 1 f32,
# 2 bf16, 3 f16; 4: non-finite weights allowed), config.json, a NUL byte,
# model.safetensors. Tiny models that load.

def model_directory(config, dtype, options, poison=None, change=None):
    """`change(tensors)` edits the tensors, to seed a refusal."""
    sys.path.insert(0, str(ROOT / "tools" / "reference"))
    from reference_model import Model  # noqa: E402 (needs torch)
    formats = {"F32": "<{}f", "F16": "<{}e"}
    tensors = {}
    for i, (name, tensor) in enumerate(Model(config).state_dict().items()):
        n = tensor.numel()
        values = [((i * 7 + j * 3) % 11 - 5) / 8 for j in range(n)]
        if name == poison:
            values[0] = float("nan")
        if dtype == "BF16":
            raw = b"".join(struct.pack("<f", v)[2:] for v in values)
        else:
            raw = struct.pack(formats[dtype].format(n), *values)
        tensors[name] = (dtype, list(tensor.shape), raw)
    if change is not None:
        change(tensors)
    return bytes([options]) + json.dumps(config).encode() + b"\0" + safetensors(tensors)


def write_model_directory_seeds():
    out = CORPUS / "model_directory_fuzz"
    dense = {"format_version": 1, "vocab_size": 256, "d_model": 2, "n_layers": 1,
             "max_seq_len": 8, "norm": "rmsnorm", "tokenizer": "byte",
             "attention": {"type": "dense", "n_heads": 1, "n_kv_heads": 1, "head_dim": 2},
             "ffn": {"type": "dense", "d_ff": 2, "bias": True}}
    (out / "dense_f16_as_stored").write_bytes(model_directory(dense, "F16", 0))
    # Refused: a tensor the config does not call for, one in another shape
    # (as many values) and one in an integer dtype.
    extra = ("F16", [2], struct.pack("<2e", 1, 2))
    (out / "dense_extra_tensor").write_bytes(model_directory(
        dense, "F16", 0, change=lambda t: t.update({"layers.0.extra.weight": extra})))
    (out / "dense_reshaped_tensor").write_bytes(model_directory(
        dense, "F16", 0, change=lambda t: t.update(
            {"layers.0.ffn.w1.weight": ("F16", [4, 1], t["layers.0.ffn.w1.weight"][2])})))
    (out / "dense_integer_tensor").write_bytes(model_directory(
        dense, "F32", 1, change=lambda t: t.update(
            {"final_norm.weight": ("I32", [2], struct.pack("<2i", 1, 1))})))
    switchall = {"format_version": 1, "vocab_size": 256, "d_model": 1, "n_layers": 1,
                 "max_seq_len": 8, "norm": "layernorm", "tokenizer": "byte",
                 "tie_embeddings": False,
                 "attention": {"type": "switchhead", "n_heads": 1, "n_kv_heads": 1,
                               "head_dim": 1, "n_experts": 2, "top_k": 1},
                 "ffn": {"type": "moe", "d_ff": 1, "n_experts": 2, "top_k": 1,
                         "router_bias": True}}
    (out / "switchall_bf16_to_f32").write_bytes(model_directory(switchall, "BF16", 1))
    spm = dict(dense, tokenizer="sentencepiece", vocab_size=300, d_model=1,
               attention={"type": "dense", "n_heads": 1, "n_kv_heads": 1, "head_dim": 1},
               ffn={"type": "dense", "d_ff": 1})
    (out / "sentencepiece_nan_allowed_f16").write_bytes(
        model_directory(spm, "F32", 4 | 3, poison="layers.0.ffn.w1.weight"))


if __name__ == "__main__":
    write_safetensors_seeds()
    write_request_seeds()
    write_http_seeds()
    write_logprobs_seeds()
    write_model_directory_seeds()

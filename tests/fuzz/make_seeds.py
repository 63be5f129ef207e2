#!/usr/bin/python3
"""Writes the generated seeds of tests/fuzz/corpus/ (the safetensors files and
the serialized GenerateRequests); the text seeds are committed as they are.
Needs protoc, grpc_python_plugin and Debian's python3-protobuf.
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
        }
        for name, request in requests.items():
            (CORPUS / "generate_request_fuzz" / name).write_bytes(request.SerializeToString())


if __name__ == "__main__":
    write_safetensors_seeds()
    write_request_seeds()

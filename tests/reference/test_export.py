"""tools/reference/export.py (which tools/train.py exports through): weights
the storage dtype cannot hold are refused, naming the tensor, before anything
is written."""
import pathlib
import sys

import pytest
import torch

ROOT = pathlib.Path(__file__).resolve().parents[2]
sys.path.insert(0, str(ROOT / "tools" / "reference"))
from export import init_random, load_model, save_model  # noqa: E402
from reference_model import Model  # noqa: E402

CFG = {"format_version": 1, "vocab_size": 256, "d_model": 16, "n_layers": 1, "max_seq_len": 32,
       "norm": "layernorm", "tokenizer": "byte",
       "attention": {"type": "switchhead", "n_heads": 2, "head_dim": 8, "n_experts": 2},
       "ffn": {"type": "moe", "d_ff": 8, "n_experts": 4, "top_k": 2}}


def model_with(name, index, value):
    model = init_random(Model(CFG), 0)
    with torch.no_grad():
        model.state_dict()[name].view(-1)[index] = value
    return model


@pytest.mark.parametrize("dtype,value,why", [
    ("f16", 7e4, "(70000) is beyond F16's range (largest finite 65504); store the weights as f32 or bf16"),
    ("bf16", 3.4e38, "is beyond BF16's range"),
    ("f32", float("nan"), "(nan) is not finite"),
])
def test_refuses_weights_the_dtype_cannot_hold(tmp_path, dtype, value, why):
    model = model_with("layers.0.ffn.w1", 9, value)
    with pytest.raises(ValueError) as e:
        save_model(model, str(tmp_path / "out"), dtype)
    assert "tensor layers.0.ffn.w1: element 9 of 512" in str(e.value) and why in str(e.value)
    assert not (tmp_path / "out").exists()


def test_writes_what_the_dtype_holds(tmp_path):
    model = model_with("layers.0.ffn.w1", 9, 65504.0)
    save_model(model, str(tmp_path / "f16"), "f16")
    got = load_model(str(tmp_path / "f16"), torch.float32).state_dict()["layers.0.ffn.w1"]
    assert float(got.view(-1)[9]) == 65504.0
    save_model(model_with("layers.0.ffn.w1", 9, 7e4), str(tmp_path / "bf16"), "bf16")

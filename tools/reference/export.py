"""Save / load a reference model in the switchserve model format directory:
config.json + model.safetensors (f32, f16 or bf16).

Library:  save_model(model, out_dir, dtype="f32", overrides=None)
          load_model(model_dir, dtype=torch.float64) -> Model
CLI:      /usr/bin/python3 tools/reference/export.py --config cfg.json \
              [--checkpoint state_dict.pt | --random-seed 0] --out DIR [--dtype bf16]
          /usr/bin/python3 tools/reference/export.py --check DIR   (load + one forward)
"""
import argparse
import json
import os
import sys

import torch

sys.path.insert(0, os.path.dirname(os.path.abspath(__file__)))
from reference_model import Model  # noqa: E402
from safetensors_io import cast_for_storage, load_file, save_file  # noqa: E402

DTYPES = {"f32": torch.float32, "f16": torch.float16, "bf16": torch.bfloat16}


def save_model(model, out_dir, dtype="f32", overrides=None):
    """Writes config.json and model.safetensors. `overrides`: {tensor name:
    storage dtype name} to mix dtypes."""
    tensors = {}
    for name, t in model.state_dict().items():
        store = DTYPES[(overrides or {}).get(name, dtype)]
        # round through f32 so f64 -> bf16 rounds once, like f32 -> bf16; a
        # value the dtype cannot hold is refused before anything is written
        tensors.update(cast_for_storage({name: t}, store))
    os.makedirs(out_dir, exist_ok=True)
    with open(os.path.join(out_dir, "config.json"), "w") as f:
        json.dump(model.raw_cfg, f, indent=2)
        f.write("\n")
    save_file(tensors, os.path.join(out_dir, "model.safetensors"))


def load_model(model_dir, dtype=torch.float64):
    """Reads a model directory; weights widened to `dtype`. Missing or extra
    tensors and shape mismatches are errors."""
    with open(os.path.join(model_dir, "config.json")) as f:
        cfg = json.load(f)
    model = Model(cfg, dtype=dtype)
    tensors = load_file(os.path.join(model_dir, "model.safetensors"))
    expected = model.state_dict()
    missing = sorted(set(expected) - set(tensors))
    extra = sorted(set(tensors) - set(expected))
    if missing or extra:
        raise ValueError(f"{model_dir}/model.safetensors: missing {missing}, extra {extra}")
    for name, t in tensors.items():
        if tuple(t.shape) != tuple(expected[name].shape):
            raise ValueError(f"{model_dir}/model.safetensors: tensor {name}: expected shape "
                             f"{list(expected[name].shape)}, found {list(t.shape)}")
    model.load_state_dict({k: v.to(torch.float32).to(dtype) for k, v in tensors.items()})
    return model


def init_random(model, seed, router_std=1.0):
    """Deterministic random weights for tests (norm weights near 1)."""
    g = torch.Generator().manual_seed(seed)
    with torch.no_grad():
        for name, p in sorted(model.named_parameters()):
            if name.endswith("norm.weight"):
                v = 1.0 + 0.1 * torch.randn(p.shape, generator=g, dtype=torch.float64)
            elif "norm.bias" in name or name.endswith(("b1", "b2", ".bias")):
                v = 0.1 * torch.randn(p.shape, generator=g, dtype=torch.float64)
            else:
                # attn.v [G*E, d, dh] maps d -> dh; everything else is [out, in]
                # (attn.o [H*E, dh, d] gets d^-1/2 too: only the scale differs)
                fan_in = p.shape[-2] if name.endswith("attn.v") and p.dim() == 3 else p.shape[-1]
                std = fan_in ** -0.5
                if name.endswith(("sel_v", "sel_o", "router.weight")):
                    std *= router_std
                if name == "embedding.weight":
                    std = 1.0
                v = std * torch.randn(p.shape, generator=g, dtype=torch.float64)
            p.copy_(v.to(p.dtype))
    return model


def main():
    ap = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    ap.add_argument("--config")
    ap.add_argument("--checkpoint", help="torch state_dict (.pt) with the format's tensor names")
    ap.add_argument("--random-seed", type=int)
    ap.add_argument("--out")
    ap.add_argument("--dtype", default="f32", choices=sorted(DTYPES))
    ap.add_argument("--check", help="load a model directory and run one forward")
    args = ap.parse_args()
    if args.check:
        m = load_model(args.check, torch.float32)
        out = m(torch.tensor([[1, 2, 3]]))
        print(f"{args.check}: ok, logits {tuple(out['logits'].shape)}, {len(out['routes'])} routers")
        return
    if not (args.config and args.out):
        ap.error("--config and --out are required")
    with open(args.config) as f:
        model = Model(json.load(f))
    if args.checkpoint:
        model.load_state_dict(torch.load(args.checkpoint, map_location="cpu"))
    else:
        init_random(model, args.random_seed or 0)
    save_model(model, args.out, args.dtype)
    print(f"wrote {args.out}")


if __name__ == "__main__":
    main()

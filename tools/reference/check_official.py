"""Runs the official SwitchHead modules on random weights, converts them with
tools/convert_official.py and checks that the reference (float64) computes
the same logits as the official code's FULL causal pass (never its KV-cache
path, which places new queries at the wrong positions).

The official code is not part of this repository: give a checkout.

  /usr/bin/python3 tools/reference/check_official.py --official-src PATH_TO_switchhead \\
      [--training-src PATH_TO_moe_attention] [--tolerance 1e-4]

--official-src: a checkout of the `switchhead` package repository (holding
switchhead/switchhead.py); its SwitchHeadXL and SwitchHeadRope run as they
are, through official_stand_ins.py's plain-PyTorch `cvmm` (their Triton
kernel needs a GPU). --training-src: a checkout of the paper's training code;
then its sigma-MoE layer (layers/moe_layer.py) runs as the feed-forward of
some cases, with stub base classes for logging and regularisation (no effect
on the forward pass).

Each case is a small language model built from the official modules:
embedding -> per layer (LayerNorm, official attention, residual; LayerNorm,
official sigma-MoE or a dense FFN, residual) -> LayerNorm -> tied output head,
run in float32 by the official code. Reported per case: max |ours - official|
relative to max |official logits|, and relative to the largest change the
attention layers make to the logits (the official logits minus those of the
same model with every attention output projection zeroed). Exits non-zero if
any exceeds --tolerance.
"""
import argparse
import importlib
import os
import sys
import types

import torch
import torch.nn.functional as F

HERE = os.path.dirname(os.path.abspath(__file__))
sys.path.insert(0, HERE)
sys.path.insert(0, os.path.dirname(HERE))
import convert_official  # noqa: E402
import official_stand_ins as stand_ins  # noqa: E402
from reference_model import Model  # noqa: E402

# (name, module, d_model, n_heads, n_experts, moe_k, d_head, T, ffn, extra module args)
CASES = [
    ("xl_E4_k2_T2", "SwitchHeadXL", 64, 2, 4, 2, 16, 2, "dense", {}),
    ("xl_E4_k2_T17", "SwitchHeadXL", 64, 2, 4, 2, 16, 17, "dense", {}),
    ("xl_E5_k3_dh12_T40", "SwitchHeadXL", 48, 3, 5, 3, 12, 40, "sigma_moe", {}),
    ("xl_E3_k1_dh24_T300", "SwitchHeadXL", 64, 4, 3, 1, 24, 300, "dense", {}),
    ("xl_E4_k2_T530", "SwitchHeadXL", 64, 2, 4, 2, 16, 530, "sigma_moe", {}),
    ("xl_E1_dh20_T33", "SwitchHeadXL", 64, 2, 1, 1, 20, 33, "dense", {}),
    ("rope_E4_k2_T40", "SwitchHeadRope", 64, 2, 4, 2, 16, 40, "sigma_moe", {}),
    ("rope_E4_k2_T530", "SwitchHeadRope", 64, 2, 4, 2, 16, 530, "dense", {}),
    ("rope_E3_k2_full_base500_T23", "SwitchHeadRope", 32, 2, 3, 2, 12, 23, "dense",
     {"rotate_fraction": 1.0, "rope_base": 500.0}),
    ("rope_E1_dh10_T20", "SwitchHeadRope", 40, 4, 1, 1, 10, 20, "dense", {"rotate_fraction": 0.4}),
]
VOCAB, N_LAYERS, SIGMA_MOE = 256, 2, dict(n_experts=8, expert_size=16, k=2)


def load_switchhead(src):
    """The official switchhead module, with the cvmm stand-in in place of
    switchhead/cvmm.py (and without running the package's __init__)."""
    pkg_dir = os.path.join(src, "switchhead")
    if not os.path.exists(os.path.join(pkg_dir, "switchhead.py")):
        raise SystemExit(f"--official-src {src}: no switchhead/switchhead.py there")
    pkg = types.ModuleType("switchhead")
    pkg.__path__ = [pkg_dir]
    sys.modules["switchhead"] = pkg
    sys.modules["switchhead.cvmm"] = stand_ins.cvmm_module("switchhead.cvmm")
    return importlib.import_module("switchhead.switchhead")


def load_sigma_moe(src):
    """The training code's MoE class from layers/moe_layer.py, with stub
    logging/regularisation base classes and the cvmm stand-in."""
    path = os.path.join(src, "layers", "moe_layer.py")
    if not os.path.exists(path):
        raise SystemExit(f"--training-src {src}: no layers/moe_layer.py there")

    class LoggingLayer:
        def __init__(self):
            super().__init__()

        def log(self, *args, **kwargs):
            pass

    class RegularizedLayer:
        def __init__(self):
            super().__init__()

        def add_reg(self, *args, **kwargs):
            pass

    class OncePerIterLayer:
        pass

    layers = types.ModuleType("layers")
    layers.__path__ = []
    layers.LoggingLayer, layers.RegularizedLayer, layers.OncePerIterLayer = \
        LoggingLayer, RegularizedLayer, OncePerIterLayer
    framework = types.ModuleType("framework")
    framework.utils = types.SimpleNamespace(relative_perplexity=lambda x: x)
    for name, mod in (("layers", layers), ("layers.cvmm", stand_ins.cvmm_module("layers.cvmm")),
                      ("framework", framework)):
        sys.modules[name] = mod
    spec = importlib.util.spec_from_file_location("official_moe_layer", path)
    module = importlib.util.module_from_spec(spec)
    spec.loader.exec_module(module)
    return module.MoE


class OfficialLM(torch.nn.Module):
    """Embedding, pre-LN blocks of the official attention and FFN, final LN,
    tied head; the parameter names are what a user's model would have."""

    def __init__(self, sh, MoE, case, seed):
        super().__init__()
        name, module, d, H, E, k, dh, T, ffn, extra = case
        torch.manual_seed(seed)
        self.tok = torch.nn.Embedding(VOCAB, d)
        self.blocks = torch.nn.ModuleList()
        cls = getattr(sh, module)
        for _ in range(N_LAYERS):
            b = torch.nn.Module()
            b.ln1, b.ln2 = torch.nn.LayerNorm(d), torch.nn.LayerNorm(d)
            b.attn = cls(d, H, E, d_head=dh, moe_k=k, **extra)
            if module == "SwitchHeadXL":
                b.attn.reset_parameters(1.0)  # the constructor leaves pos_to_pk uninitialised
            if ffn == "sigma_moe":
                b.moe = MoE(d, SIGMA_MOE["n_experts"], SIGMA_MOE["expert_size"], n_heads=SIGMA_MOE["k"],
                            selection_mode="sigmoid", activation=F.relu)
            else:
                b.w1, b.w2 = torch.nn.Linear(d, 4 * d), torch.nn.Linear(4 * d, d)
            with torch.no_grad():  # norms away from 1/0, so that the conversion of each is visible
                for ln in (b.ln1, b.ln2):
                    ln.weight.add_(0.1 * torch.randn(d))
                    ln.bias.add_(0.1 * torch.randn(d))
            self.blocks.append(b)
        self.ln_out = torch.nn.LayerNorm(d)

    def forward(self, tokens):
        x = self.tok(tokens)
        for b in self.blocks:
            xn = b.ln1(x)
            y, _ = b.attn(xn, xn, xn, mask=None)  # full causal pass, no KV cache
            x = x + y
            xn = b.ln2(x)
            x = x + (b.moe(xn) if hasattr(b, "moe") else b.w2(F.gelu(b.w1(xn))))
        return self.ln_out(x) @ self.tok.weight.t()


def spec_for(case):
    name, module, d, H, E, k, dh, T, ffn, extra = case
    spec = {"config": {"format_version": 1, "name": name, "vocab_size": VOCAB, "d_model": d, "n_layers": N_LAYERS,
                       "max_seq_len": 1024, "norm": "layernorm", "tokenizer": "byte"},
            "attention": dict({"module": module, "prefix": "blocks.{i}.attn.", "n_heads": H, "moe_k": k}, **extra),
            "rename": {"tok.": "embedding.", "ln_out.": "final_norm.", "blocks.{i}.ln1.": "layers.{i}.attn_norm.",
                       "blocks.{i}.ln2.": "layers.{i}.ffn_norm.", "blocks.{i}.w1.": "layers.{i}.ffn.w1.",
                       "blocks.{i}.w2.": "layers.{i}.ffn.w2."}}
    if ffn == "sigma_moe":
        spec["ffn"] = {"module": "sigma_moe", "prefix": "blocks.{i}.moe.", "k": SIGMA_MOE["k"], "activation": "relu"}
    else:
        spec["config"]["ffn"] = {"type": "dense", "d_ff": 4 * d, "activation": "gelu", "bias": True}
    return spec


def run_case(sh, MoE, case, seed):
    official = OfficialLM(sh, MoE, case, seed).eval()
    T = case[7]
    tokens = torch.randint(0, VOCAB, (1, T), generator=torch.Generator().manual_seed(seed))
    with torch.no_grad():
        want = official(tokens)[0].double()
        saved = [b.attn.o.detach().clone() for b in official.blocks]
        for b in official.blocks:
            b.attn.o.zero_()
        no_attention = official(tokens)[0].double()
        for b, o in zip(official.blocks, saved):
            b.attn.o.copy_(o)
    cfg, tensors = convert_official.convert_modules(official.state_dict(), spec_for(case))
    ours_model = Model(cfg, dtype=torch.float64)
    ours_model.load_state_dict({n: t.to(torch.float64) for n, t in tensors.items()})
    ours = ours_model(tokens)["logits"][0]
    diff = float((ours - want).abs().max())
    return diff / float(want.abs().max()), diff / float((want - no_attention).abs().max())


def main():
    ap = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    ap.add_argument("--official-src", required=True)
    ap.add_argument("--training-src")
    ap.add_argument("--tolerance", type=float, default=1e-4)
    ap.add_argument("--only")
    args = ap.parse_args()
    torch.set_num_threads(2)
    with stand_ins.torch_compat() as installed:
        sh = load_switchhead(os.path.abspath(args.official_src))
        MoE = load_sigma_moe(os.path.abspath(args.training_src)) if args.training_src else None
        print(f"torch {torch.__version__}; official cvmm replaced by the plain-PyTorch stand-in"
              + (f"; also stood in: {', '.join(installed)}" if installed else ""))
        print(f"{'case':32} {'T':>4}  rel err (logits)  rel err (attention's effect)")
        worst = 0.0
        for i, case in enumerate(CASES):
            if args.only and case[0] != args.only:
                continue
            if case[8] == "sigma_moe" and MoE is None:
                case = case[:8] + ("dense",) + case[9:]
            e_logits, e_attn = run_case(sh, MoE, case, 100 + i)
            worst = max(worst, e_logits, e_attn)
            ffn = "sigma-MoE" if case[8] == "sigma_moe" else "dense FFN"
            print(f"{case[0] + ' (' + ffn + ')':32} {case[7]:>4}  {e_logits:16.2e}  {e_attn:16.2e}")
    ok = worst <= args.tolerance
    print(f"{'ok' if ok else 'FAIL'}: worst {worst:.2e} (tolerance {args.tolerance:g})")
    return 0 if ok else 1


if __name__ == "__main__":
    sys.exit(main())

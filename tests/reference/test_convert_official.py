"""tools/convert_official.py: state dicts with the official parameter names and
shapes (built here with random values), converted, must give the same logits
through the reference (tools/reference) as an independent computation of the
official math (official_math.py), and unmappable checkpoints must be refused
naming the parameter or argument."""
import json
import math
import pathlib
import subprocess
import sys

import pytest
import torch
import torch.nn.functional as F

ROOT = pathlib.Path(__file__).resolve().parents[2]
sys.path.insert(0, str(ROOT / "tools"))
sys.path.insert(0, str(ROOT / "tools" / "reference"))
sys.path.insert(0, str(pathlib.Path(__file__).resolve().parent))
import convert_official as conv  # noqa: E402
import official_math as om  # noqa: E402
from export import load_model  # noqa: E402
from reference_model import Model  # noqa: E402

TOL = 1e-10


def rel_err(a, b):
    return float((a - b).abs().max() / b.abs().max())


def rnd(g, *shape, std=None):
    std = std if std is not None else shape[-1] ** -0.5
    return std * torch.randn(*shape, generator=g, dtype=torch.float64)


def switchhead_params(g, d, H, E, dh, xl):
    """One official SwitchHead module's state dict (switchhead.py L41-52, L277)."""
    P = {"q.weight": rnd(g, H * dh, d), "k.weight": rnd(g, H * dh, d)}
    if E > 1:
        P.update(v=rnd(g, H * E, d, dh, std=d ** -0.5), o=rnd(g, H * E, dh, d), sel_v=rnd(g, H * E, d, std=2.0),
                 sel_o=rnd(g, H * E, d, std=2.0))
    else:
        P.update(v=rnd(g, H * dh, d), o=rnd(g, d, H * dh), sel_o=rnd(g, H, d))
    if xl:
        P["pos_to_pk"] = rnd(g, H * dh, d)
    return P


def sigma_moe_params(g, d, X, F_):
    return {"keys": rnd(g, X, d, F_, std=d ** -0.5), "values": rnd(g, X, F_, d), "expert_sel": rnd(g, X, d, std=2.0),
            "kv_sel_counts_100": torch.zeros(X, F_)}


# ------------------------------------------------------------ modules mode --
def user_model(g, d, V, n_layers, H, E, dh, k, xl, ffn):
    """A model a user could build from the official modules: embedding, then
    pre-LN blocks of (LayerNorm, SwitchHead module) and (LayerNorm, sigma-MoE
    or a dense FFN under the format's names), a final LayerNorm, tied head."""
    sd = {"tok.weight": rnd(g, V, d, std=1.0), "norm_out.weight": 1 + 0.1 * rnd(g, d, std=1.0),
          "norm_out.bias": 0.1 * rnd(g, d, std=1.0)}
    for i in range(n_layers):
        for n in ("ln1", "ln2"):
            sd[f"blocks.{i}.{n}.weight"] = 1 + 0.1 * rnd(g, d, std=1.0)
            sd[f"blocks.{i}.{n}.bias"] = 0.1 * rnd(g, d, std=1.0)
        sd.update({f"blocks.{i}.attn.{k_}": v for k_, v in switchhead_params(g, d, H, E, dh, xl).items()})
        if ffn == "sigma_moe":
            sd.update({f"blocks.{i}.moe.{k_}": v for k_, v in sigma_moe_params(g, d, 6, 12).items()})
        else:
            sd.update({f"layers.{i}.ffn.w1.weight": rnd(g, 16, d), f"layers.{i}.ffn.w1.bias": rnd(g, 16, std=0.1),
                       f"layers.{i}.ffn.w2.weight": rnd(g, d, 16), f"layers.{i}.ffn.w2.bias": rnd(g, d, std=0.1)})
    return sd


def user_forward(sd, tokens, n_layers, H, k, position, ffn, moe_k=2, rotate_fraction=0.5, rope_base=10000.0):
    d = sd["tok.weight"].shape[1]
    x = sd["tok.weight"][tokens]
    for i in range(n_layers):
        P = {n[len(f"blocks.{i}.attn."):]: t for n, t in sd.items() if n.startswith(f"blocks.{i}.attn.")}
        x = x + om.attention(om.layer_norm(x, sd, f"blocks.{i}.ln1", d), P, H, k, position, rotate_fraction,
                             rope_base)
        xn = om.layer_norm(x, sd, f"blocks.{i}.ln2", d)
        if ffn == "sigma_moe":
            p = f"blocks.{i}.moe."
            x = x + om.sigma_moe(xn, sd[p + "keys"], sd[p + "values"], sd[p + "expert_sel"], moe_k)
        else:
            p = f"layers.{i}.ffn."
            x = x + F.gelu(xn @ sd[p + "w1.weight"].t() + sd[p + "w1.bias"]) @ sd[p + "w2.weight"].t() \
                + sd[p + "w2.bias"]
    return om.layer_norm(x, sd, "norm_out", d) @ sd["tok.weight"].t()


def spec_for(module, n_layers, H, k, ffn, d, V, **attn):
    spec = {"config": {"format_version": 1, "vocab_size": V, "d_model": d, "n_layers": n_layers,
                       "max_seq_len": 128, "norm": "layernorm", "tokenizer": "byte"},
            "attention": dict({"module": module, "prefix": "blocks.{i}.attn.", "n_heads": H, "moe_k": k}, **attn),
            "rename": {"tok.": "embedding.", "norm_out.": "final_norm.", "blocks.{i}.ln1.": "layers.{i}.attn_norm.",
                       "blocks.{i}.ln2.": "layers.{i}.ffn_norm."}}
    if ffn == "sigma_moe":
        spec["ffn"] = {"module": "sigma_moe", "prefix": "blocks.{i}.moe.", "k": 2}
    else:
        spec["config"]["ffn"] = {"type": "dense", "d_ff": 16, "activation": "gelu"}
    return spec


def reference_logits(cfg, tensors, tokens, tmp_path):
    conv.write_model(str(tmp_path), cfg, tensors, "f32")
    m32 = load_model(str(tmp_path), torch.float64)  # the written file loads
    m = Model(cfg, dtype=torch.float64)
    m.load_state_dict({k: v.to(torch.float64) for k, v in tensors.items()})
    return m(tokens[None])["logits"][0], m32


@pytest.mark.parametrize("module,E,k,dh,T,ffn", [
    ("SwitchHeadXL", 4, 2, 12, 20, "dense"),          # head size != d/H, past a 16-token block
    ("SwitchHeadXL", 3, 1, 8, 37, "sigma_moe"),
    ("SwitchHeadXL", 1, 1, 10, 18, "dense"),          # n_experts 1: dense V/O, per-head output gate
    ("SwitchHeadRope", 4, 2, 8, 21, "sigma_moe"),
    ("SwitchHeadRope", 2, 2, 12, 5, "dense"),
])
def test_official_modules_convert_to_the_same_function(module, E, k, dh, T, ffn, tmp_path):
    g = torch.Generator().manual_seed(hash((module, E, k, dh, T)) % 1000)
    d, V, H, L = 32, 256, 2, 2
    sd = user_model(g, d, V, L, H, E, dh, k, module == "SwitchHeadXL", ffn)
    rf = 0.5 if dh % 4 == 0 else 1.0 / 3.0
    extra = {"rotate_fraction": rf, "rope_base": 500.0} if module == "SwitchHeadRope" else {}
    cfg, tensors = conv.convert_modules(sd, spec_for(module, L, H, k, ffn, d, V, **extra))
    assert cfg["attention"]["position"] == ("xl" if module == "SwitchHeadXL" else "rope")
    assert cfg["attention"]["n_experts"] == E and cfg["attention"]["head_dim"] == dh
    tokens = torch.randint(0, V, (T,), generator=g)
    ours, m32 = reference_logits(cfg, tensors, tokens, tmp_path)
    want = user_forward(sd, tokens, L, H, k, "xl" if module == "SwitchHeadXL" else "rope", ffn,
                        rotate_fraction=rf, rope_base=500.0)
    assert rel_err(ours, want) < TOL
    # the model directory as written (f32 storage) gives the same function to f32 rounding
    assert rel_err(m32(tokens[None])["logits"][0], want) < 1e-5


# --------------------------------------------------------------- lm mode --
def lm_args(**kw):
    a = {"transformer.variant": "preln_moe", "state_size": 32, "transformer.n_heads": 2,
         "transformer.encoder_n_layers": 2, "transformer.head_projection_size": 10, "transformer.activation": "relu",
         "tied_embedding": True, "embedding_size": None, "moe.att.enable": True, "moe.att.variant": "full",
         "moe.att.n_experts": 4, "moe.att.k": 2, "moe.att.q_expert": False, "moe.att.k_expert": False,
         "moe.att.v_expert": True, "moe.att.o_expert": True, "moe.att.selection_mode": "sigmoid",
         "moe.n_experts": 6, "moe.expert_size": 12, "pkm.n_heads": 2, "moe.selection_mode": "sigmoid",
         "lm.unroll": 64, "lm.trafo.context_blocks": 1}
    a.update(kw)
    return a


def lm_state_dict(g, args, V=256):
    """TransformerLanguageModel parameter names (models/transformer_language_model.py,
    layers/transformer/relative_moe_transformer.py, full_moe_relative_attention.py)."""
    d, H = args["state_size"], args["transformer.n_heads"]
    dh = args["transformer.head_projection_size"] or d // H
    E = args["moe.att.n_experts"]
    emb = rnd(g, V, d, std=1.0)
    sd = {"embedding.weight": emb, "output.weight": emb if args["tied_embedding"] else rnd(g, V, d),
          "output.bias": rnd(g, V, std=0.1), "out_norm.weight": 1 + 0.1 * rnd(g, d, std=1.0),
          "out_norm.bias": 0.1 * rnd(g, d, std=1.0)}
    for i in range(args["transformer.encoder_n_layers"]):
        p = f"unique_layers.{i}."
        a = p + "self_attn."
        for n in ("norm1", "norm2"):
            if args.get("transformer.ln_affine", True) or args["transformer.variant"] != "preln_moe":
                sd[p + n + ".weight"] = 1 + 0.1 * rnd(g, d, std=1.0)
                sd[p + n + ".bias"] = 0.1 * rnd(g, d, std=1.0)
        sd[a + "projections.q"] = rnd(g, H * dh, d)
        sd[a + "projections.k"] = rnd(g, H * dh, d)
        if args["moe.att.v_expert"]:
            rows = E if args.get("moe.att.shared_experts") else H * E
            sd[a + "projections.v"] = rnd(g, rows, d, dh, std=d ** -0.5)
            sd[a + "projections.o"] = rnd(g, rows, dh, d)
            sd[a + "selections.o"] = rnd(g, H * E, d, std=2.0)
            if not om.shares_selections(args):
                sd[a + "selections.v"] = rnd(g, H * E, d, std=2.0)
        else:
            sd[a + "projections.v"] = rnd(g, H * dh, d)
            sd[a + "projections.o"] = rnd(g, d, H * dh)
        if args["moe.att.variant"] == "full":
            sd[a + "pos_to_pk"] = rnd(g, H * dh, d)
        if args["transformer.variant"] == "preln_moe":
            sd.update({p + "pkm." + k: v for k, v in
                       sigma_moe_params(g, d, args["moe.n_experts"], args["moe.expert_size"]).items()})
        else:
            sd.update({p + "linear1.weight": rnd(g, 40, d), p + "linear1.bias": rnd(g, 40, std=0.1),
                       p + "linear2.weight": rnd(g, d, 40), p + "linear2.bias": rnd(g, d, std=0.1)})
    return sd


@pytest.mark.parametrize("name,kw,T", [
    ("xl_sigma_moe_tied", {}, 33),
    ("xl_same_sel_shared_softmax", {"moe.att.same_sel": True, "moe.att.shared_experts": True,
                                    "moe.att.selection_mode": "softmax", "transformer.activation": "gelu",
                                    "moe.selection_mode": "gate", "tied_embedding": False}, 19),
    ("rope_same_sel_own_v_selection", {"moe.att.variant": "full_rope", "moe.att.same_sel": True,
                                       "rope.rotate_fraction": 0.6}, 15),
    ("xl_no_ln_affine", {"transformer.ln_affine": False, "transformer.head_projection_size": None}, 17),
    ("rope_dense_ffn", {"transformer.variant": "preln_moeatt", "moe.att.variant": "full_rope",
                        "rope.rotate_fraction": 0.6, "rope.base": 300.0, "tied_embedding": False}, 24),
    ("xl_dense_attention", {"transformer.variant": "preln_moeatt", "moe.att.v_expert": False,
                            "moe.att.o_expert": False}, 21),
])
def test_training_lm_converts_to_the_same_function(name, kw, T, tmp_path):
    g = torch.Generator().manual_seed(len(name) * 7 + T)
    args = lm_args(**kw)
    sd = lm_state_dict(g, args)
    cfg, tensors = conv.convert_lm(sd, args, name=name)
    assert cfg["output_bias"] is True and cfg["tie_embeddings"] == bool(args["tied_embedding"])
    assert cfg["max_seq_len"] == 128  # lm.unroll x (1 + context_blocks)
    tokens = torch.randint(0, 256, (T,), generator=g)
    ours, m32 = reference_logits(cfg, tensors, tokens, tmp_path)
    want = om.training_lm(sd, args, tokens)
    assert rel_err(ours, want) < TOL
    assert rel_err(m32(tokens[None])["logits"][0], want) < 1e-5


# ----------------------------------------------------------------- refusals --
def refuse(fn, *needles):
    with pytest.raises(conv.ConversionError) as e:
        fn()
    for n in needles:
        assert n in str(e.value), f"{n!r} not in {e.value}"


def test_lm_refusals():
    g = torch.Generator().manual_seed(5)
    base = lm_args()
    sd = lm_state_dict(g, base)
    refuse(lambda: conv.convert_lm(dict(sd, **{"unique_layers.0.self_attn.norm_ret.weight": torch.ones(10)}),
                                   base), "unique_layers.0.self_attn.norm_ret.weight")
    refuse(lambda: conv.convert_lm(dict(sd, **{"unique_layers.1.extra": torch.ones(3)}), base),
           "cannot map parameter unique_layers.1.extra")
    missing = dict(sd)
    del missing["unique_layers.1.self_attn.pos_to_pk"]
    refuse(lambda: conv.convert_lm(missing, base), "missing parameter unique_layers.1.self_attn.pos_to_pk")
    bad = dict(sd, **{"unique_layers.0.pkm.values": torch.zeros(6, 12, 31)})
    refuse(lambda: conv.convert_lm(bad, base), "unique_layers.0.pkm.values", "[6, 12, 32]")
    nan = dict(sd, **{"unique_layers.0.self_attn.pos_to_pk": torch.full((20, 32), float("nan"))})
    refuse(lambda: conv.convert_lm(nan, base), "unique_layers.0.self_attn.pos_to_pk", "non-finite")
    refuse(lambda: conv.convert_lm(sd, dict(base, **{"moe.att.q_expert": True})), "moe.att.q_expert")
    refuse(lambda: conv.convert_lm(sd, dict(base, **{"transformer.variant": "moe"})), "transformer.variant")
    refuse(lambda: conv.convert_lm(sd, dict(base, **{"moe.att.enable": False})), "moe.att.enable")
    refuse(lambda: conv.convert_lm(sd, dict(base, **{"moe.sel_norm": "cos"})), "moe.sel_norm")
    refuse(lambda: conv.convert_lm(sd, dict(base, **{"moe.selection_mode": "mul"})), "selection_mode 'mul'")
    refuse(lambda: conv.convert_lm(sd, dict(base, **{"transformer.activation": "topk"})), "transformer.activation")
    refuse(lambda: conv.convert_lm(sd, dict(base, **{"moe.att.v_expert": False})), "v_expert / o_expert")
    refuse(lambda: conv.convert_lm(dict(sd, **{"embedding_adapter.weight": torch.ones(32, 16)}), base),
           "embedding_adapter.weight")
    untied = dict(sd, **{"output.weight": sd["output.weight"] + 1})
    refuse(lambda: conv.convert_lm(untied, base), "output.weight", "tied_embedding")
    rope = lm_args(**{"moe.att.variant": "full_rope", "rope.rotate_fraction": 0.3})  # 3 of 10 channels
    sd_rope = lm_state_dict(g, rope)
    refuse(lambda: conv.convert_lm(sd_rope, rope), "rotate_fraction 0.3", "odd")
    refuse(lambda: conv.convert_lm(sd_rope, dict(base)), "missing parameter unique_layers.0.self_attn.pos_to_pk")
    no_unroll = {k: v for k, v in base.items() if k != "lm.unroll"}
    refuse(lambda: conv.convert_lm(sd, no_unroll), "lm.unroll", "--max-seq-len")


def test_modules_refusals():
    g = torch.Generator().manual_seed(6)
    sd = user_model(g, 32, 256, 2, 2, 4, 8, 2, True, "dense")
    spec = spec_for("SwitchHeadXL", 2, 2, 2, "dense", 32, 256)
    refuse(lambda: conv.convert_modules(dict(sd, **{"blocks.0.attn.extra_bias": torch.ones(4)}), spec),
           "cannot map parameter blocks.0.attn.extra_bias")
    refuse(lambda: conv.convert_modules(sd, dict(spec, attention=dict(spec["attention"], moe_k=5))), "moe_k 5")
    refuse(lambda: conv.convert_modules(sd, dict(spec, attention=dict(spec["attention"], module="MoA"))),
           "attention.module 'MoA'")
    # an XL checkpoint read as RoPE: pos_to_pk has no place
    refuse(lambda: conv.convert_modules(sd, dict(spec, attention=dict(spec["attention"], module="SwitchHeadRope"))),
           "blocks.0.attn.pos_to_pk")
    # the official XL module never initialises pos_to_pk: garbage is refused when it is not finite
    nan = dict(sd, **{"blocks.1.attn.pos_to_pk": torch.full((16, 32), float("inf"))})
    refuse(lambda: conv.convert_modules(nan, spec), "blocks.1.attn.pos_to_pk", "non-finite")
    huge = dict(sd, **{"blocks.0.attn.pos_to_pk": torch.full((16, 32), 2.9e37)})
    refuse(lambda: conv.convert_modules(huge, spec), "blocks.0.attn.pos_to_pk", "uninitialised")
    wrong_heads = dict(spec, attention=dict(spec["attention"], n_heads=3))
    refuse(lambda: conv.convert_modules(sd, wrong_heads), "blocks.0.attn.q.weight")
    no_rename = dict(spec, rename={})
    refuse(lambda: conv.convert_modules(sd, no_rename), "cannot map parameter")
    clash = dict(spec, config=dict(spec["config"], attention={"head_dim": 9}))
    refuse(lambda: conv.convert_modules(sd, clash), "attention.head_dim 9")
    # The official module routes values on the source side, each head with its
    # own router: a spec that says otherwise was written into the model.
    for key, value in (("value_routing", "destination"), ("shared_router", True)):
        other = dict(spec, config=dict(spec["config"], attention={key: value}))
        refuse(lambda: conv.convert_modules(sd, other), f"attention.{key}")


def test_modules_refuses_the_flags_of_lm_mode(tmp_path):
    """--name, --max-seq-len and --tokenizer belong to lm mode (the spec's
    config says them in modules mode): they were dropped unseen, and
    --tokenizer-model copied beside a byte-level model."""
    g = torch.Generator().manual_seed(9)
    ckpt = tmp_path / "modules.pt"
    torch.save(user_model(g, 32, 256, 2, 2, 4, 8, 2, True, "dense"), ckpt)
    spec = tmp_path / "spec.json"
    spec.write_text(json.dumps(spec_for("SwitchHeadXL", 2, 2, 2, "dense", 32, 256)))
    base = [sys.executable, str(ROOT / "tools" / "convert_official.py"), "modules", "--checkpoint", str(ckpt),
            "--spec", str(spec), "--out", str(tmp_path / "out")]
    for extra, needle in ((["--name", "x"], "--name"), (["--max-seq-len", "4096"], "--max-seq-len"),
                          (["--tokenizer", "sentencepiece"], "--tokenizer"),
                          (["--tokenizer-model", str(spec)], "--tokenizer-model")):
        r = subprocess.run(base + extra, capture_output=True, text=True)
        assert r.returncode == 2 and needle in r.stderr, (extra, r.stderr)
        assert not (tmp_path / "out").exists()
    r = subprocess.run(base, capture_output=True, text=True)
    assert r.returncode == 0, r.stderr


def test_cli_writes_a_loadable_model(tmp_path):
    g = torch.Generator().manual_seed(8)
    args = lm_args()
    sd = lm_state_dict(g, args)
    ckpt = tmp_path / "model-100.pth"
    torch.save({"model": sd, "run_invariants": {"args": args}}, ckpt)
    out = tmp_path / "converted"
    r = subprocess.run([sys.executable, str(ROOT / "tools" / "convert_official.py"), "lm", "--checkpoint", str(ckpt),
                        "--out", str(out), "--name", "paper-xl"], capture_output=True, text=True)
    assert r.returncode == 0, r.stderr
    cfg = json.loads((out / "config.json").read_text())
    assert cfg["attention"]["position"] == "xl" and cfg["name"] == "paper-xl"
    tokens = torch.randint(0, 256, (20,), generator=g)
    got = load_model(str(out), torch.float64)(tokens[None])["logits"][0]
    assert rel_err(got, om.training_lm(sd, args, tokens)) < 1e-5
    bad = tmp_path / "bad.pth"
    torch.save(dict(sd, **{"unique_layers.0.mystery": torch.ones(2)}), bad)
    r = subprocess.run([sys.executable, str(ROOT / "tools" / "convert_official.py"), "lm", "--checkpoint", str(bad),
                        "--args", str(tmp_path / "args.json"), "--out", str(tmp_path / "x")],
                       capture_output=True, text=True)
    assert r.returncode != 0  # args.json does not exist
    (tmp_path / "args.json").write_text(json.dumps(args))
    r = subprocess.run([sys.executable, str(ROOT / "tools" / "convert_official.py"), "lm", "--checkpoint", str(bad),
                        "--args", str(tmp_path / "args.json"), "--out", str(tmp_path / "x")],
                       capture_output=True, text=True)
    assert r.returncode == 2 and "unique_layers.0.mystery" in r.stderr
    assert not (tmp_path / "x" / "model.safetensors").exists()


def test_sinusoid_matches_the_training_code_formula():
    # the training code builds pe with exp(2m * -ln(10000)/d) in float32; the reference uses float64
    from reference_model import sinusoid
    p = torch.arange(-600, 601)
    d = 64
    pos = torch.arange(-600, 601, dtype=torch.float).unsqueeze(1)
    div = torch.exp(torch.arange(0, d, 2, dtype=torch.float) * (-math.log(10000.0) / d))
    pe = torch.zeros(len(p), d)
    pe[:, 0::2] = torch.sin(pos * div)
    pe[:, 1::2] = torch.cos(pos * div)
    assert float((sinusoid(p, d) - pe.double()).abs().max()) < 1e-3  # f32 rounding of p*w at |p| 600
    assert float((sinusoid(p[590:611], d) - pe[590:611].double()).abs().max()) < 1e-6


def test_cli_refuses_weights_the_dtype_cannot_hold(tmp_path):
    """f16 holds at most 65504: a larger weight became infinity in the written
    file (exit 0), which the server then refused to load."""
    g = torch.Generator().manual_seed(10)
    sd = user_model(g, 32, 256, 2, 2, 4, 8, 2, True, "dense")
    sd["blocks.1.attn.q.weight"][3, 5] = 1e5
    ckpt = tmp_path / "modules.pt"
    torch.save(sd, ckpt)
    spec = tmp_path / "spec.json"
    spec.write_text(json.dumps(spec_for("SwitchHeadXL", 2, 2, 2, "dense", 32, 256)))
    base = [sys.executable, str(ROOT / "tools" / "convert_official.py"), "modules", "--checkpoint", str(ckpt),
            "--spec", str(spec)]
    r = subprocess.run(base + ["--dtype", "f16", "--out", str(tmp_path / "f16")], capture_output=True, text=True)
    assert r.returncode == 2, r.stderr
    assert "--dtype f16: tensor layers.1.attn.q.weight: element 101 of 512 (100000) is beyond F16's range" in r.stderr
    assert not (tmp_path / "f16").exists()
    r = subprocess.run(base + ["--dtype", "bf16", "--out", str(tmp_path / "bf16")], capture_output=True, text=True)
    assert r.returncode == 0, r.stderr
    got = load_model(str(tmp_path / "bf16"), torch.float32).state_dict()["layers.1.attn.q.weight"]
    assert float(got[3, 5]) == 99840.0  # 1e5 rounded to bf16

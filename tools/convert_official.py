"""Converts checkpoints of the official SwitchHead code into a switchserve model
directory (config.json + model.safetensors, docs/model-format.md).

Two sources:

  lm       the SwitchHead paper's training code (moe_attention): a
           TransformerLanguageModel state dict plus the run's arguments (the
           flat dict the training code saves as run_invariants["args"]).
           Pre-LayerNorm variants "preln_moe" (sigma-MoE feed-forward, needs
           moe.att.enable) and "preln_moeatt" (dense feed-forward), with the
           attention variant "full" (Transformer-XL positions) or "full_rope".
  modules  a model built from the official modules (switchhead's SwitchHeadXL /
           SwitchHeadRope, the training code's sigma-MoE `MoE` layer): a JSON
           spec says where each layer's module lives in the state dict, the
           module arguments the weights do not show (n_heads, moe_k, ...), how
           to rename the other tensors into the format's names, and the rest of
           config.json.

Everything in the state dict must be mapped (known statistics buffers aside)
and everything the format needs must be found: anything else stops the
conversion with a message naming the parameter or argument.

  /usr/bin/python3 tools/convert_official.py lm --checkpoint model.pth [--args args.json] \\
      --tokenizer byte|sentencepiece [--tokenizer-model spm.model] [--max-seq-len N] --out DIR
  /usr/bin/python3 tools/convert_official.py modules --checkpoint sd.pt --spec spec.json --out DIR
  (--dtype f32|f16|bf16, default f32; --name NAME)
"""
import argparse
import copy
import json
import os
import pickle
import re
import shutil
import sys

import torch

HERE = os.path.dirname(os.path.abspath(__file__))
sys.path.insert(0, os.path.join(HERE, "reference"))
from reference_model import Model, rotary_dims  # noqa: E402
from safetensors_io import cast_for_storage, load_file, save_file  # noqa: E402


class ConversionError(ValueError):
    pass


# Trained position keys are O(1); SwitchHeadXL's uninitialised pos_to_pk
# (torch.empty) holds whatever memory held, often 1e30 and more.
POS_TO_PK_LIMIT = 1e4


# ------------------------------------------------------------ state dicts --
class _Opaque(dict):
    """Stands in for a class of the training framework while unpickling a
    checkpoint (only its tensors matter here)."""

    def __setstate__(self, state):
        if isinstance(state, dict):
            self.update(state)


class _Unpickler(pickle.Unpickler):
    def find_class(self, module, name):
        if module.split(".")[0] in ("torch", "collections", "builtins", "numpy", "_codecs"):
            return super().find_class(module, name)
        return _Opaque


class _PickleModule:
    Unpickler = _Unpickler
    load = pickle.load


def load_checkpoint(path):
    """-> (state dict, saved training arguments or None). Accepts a plain
    state dict (torch file or .safetensors) or a training checkpoint holding
    "model" and "run_invariants"."""
    if path.endswith(".safetensors"):
        return load_file(path), None
    obj = torch.load(path, map_location="cpu", pickle_module=_PickleModule)
    args = None
    if isinstance(obj, dict) and "model" in obj and isinstance(obj["model"], dict):
        args = (obj.get("run_invariants") or {}).get("args")
        obj = obj["model"]
    if not isinstance(obj, dict) or not all(torch.is_tensor(v) for v in obj.values()):
        raise ConversionError(f"{path}: not a state dict (name -> tensor)")
    return dict(obj), args


class _Tensors:
    """The source state dict; tracks which tensors were used."""

    # the sigma-MoE layer's usage statistics (a persistent buffer, not a weight)
    IGNORED = re.compile(r"(^|\.)kv_sel_counts(_100)?$")

    def __init__(self, sd):
        self.sd = {k: v.detach().to(torch.float64) for k, v in sd.items()}
        self.used = set()

    def has(self, name):
        return name in self.sd

    def take(self, name, shape=None, why=""):
        if name not in self.sd:
            raise ConversionError(f"missing parameter {name}" + (f" ({why})" if why else ""))
        t = self.sd[name]
        if shape is not None and tuple(t.shape) != tuple(shape):
            raise ConversionError(f"parameter {name}: expected shape {list(shape)}, found {list(t.shape)}"
                                  + (f" ({why})" if why else ""))
        if not torch.isfinite(t).all():
            raise ConversionError(f"parameter {name}: non-finite values (an uninitialised parameter?)")
        self.used.add(name)
        return t

    def ignore(self, name):
        self.used.add(name)

    def finish(self):
        left = sorted(k for k in self.sd if k not in self.used and not self.IGNORED.search(k))
        if left:
            raise ConversionError(f"cannot map parameter {left[0]}" +
                                  (f" (and {len(left) - 1} more: {', '.join(left[1:6])})" if len(left) > 1 else ""))


def check_against_format(cfg, tensors):
    """The converted set must be exactly what the format expects for cfg."""
    try:
        expected = {k: tuple(v.shape) for k, v in Model(cfg, dtype=torch.float32).state_dict().items()}
    except (ValueError, AssertionError) as e:
        raise ConversionError(f"resulting config.json is not valid: {e}") from e
    for name in sorted(expected):
        if name not in tensors:
            raise ConversionError(f"no source parameter for {name}")
        if tuple(tensors[name].shape) != expected[name]:
            raise ConversionError(f"{name}: expected shape {list(expected[name])}, "
                                  f"converted {list(tensors[name].shape)}")
    extra = sorted(set(tensors) - set(expected))
    if extra:
        raise ConversionError(f"converted tensor {extra[0]} has no place in the format")


# ------------------------------------------------------- official modules --
def switchhead_module(src, prefix, n_heads, moe_k, position, d_model, rotate_fraction=0.5, rope_base=10000.0):
    """One official SwitchHeadXL / SwitchHeadRope module at `prefix` ->
    (attention config, {format name under attn.: tensor})."""
    H = n_heads
    q = src.take(prefix + "q.weight")
    if q.dim() != 2 or q.shape[1] != d_model or q.shape[0] % H:
        raise ConversionError(f"parameter {prefix}q.weight: expected [n_heads*d_head, {d_model}], "
                              f"found {list(q.shape)}")
    dh = q.shape[0] // H
    out = {"q.weight": q, "k.weight": src.take(prefix + "k.weight", (H * dh, d_model))}
    v = src.take(prefix + "v")
    if v.dim() == 3:
        if v.shape[0] % H:
            raise ConversionError(f"parameter {prefix}v: {v.shape[0]} rows is not n_heads ({H}) x n_experts")
        E = v.shape[0] // H
        out["v"] = src.take(prefix + "v", (H * E, d_model, dh))
        out["o"] = src.take(prefix + "o", (H * E, dh, d_model))
        out["sel_v"] = src.take(prefix + "sel_v", (H * E, d_model))
        out["sel_o"] = src.take(prefix + "sel_o", (H * E, d_model))
        if not 1 <= moe_k <= E:
            raise ConversionError(f"moe_k {moe_k}: expected 1..{E} (n_experts)")
    else:
        E = 1
        out["v"] = src.take(prefix + "v", (H * dh, d_model))
        out["o"] = src.take(prefix + "o", (d_model, H * dh))
        out["sel_o"] = src.take(prefix + "sel_o", (H, d_model), "the per-head output gate of n_experts 1")
    # The official module picks values on the key's (source) side and gives
    # every head its own router: a spec may not say otherwise.
    attn = {"type": "switchhead", "n_heads": H, "n_kv_heads": H, "head_dim": dh, "n_experts": E,
            "top_k": moe_k if E > 1 else 1, "gate": "sigmoid", "value_routing": "source",
            "shared_router": False}
    attn.update(_position(src, prefix, position, H, dh, d_model, rotate_fraction, rope_base, out))
    return attn, out


def _position(src, prefix, position, H, dh, d_model, rotate_fraction, rope_base, out):
    if position == "xl":
        if d_model % 2:
            raise ConversionError(f"d_model {d_model}: XL positions need an even width")
        out["pos_to_pk"] = src.take(prefix + "pos_to_pk", (H * dh, d_model))
        if float(out["pos_to_pk"].abs().max()) > POS_TO_PK_LIMIT:
            raise ConversionError(f"parameter {prefix}pos_to_pk: values up to {float(out['pos_to_pk'].abs().max()):.1e}"
                                  " look uninitialised (SwitchHeadXL's constructor leaves pos_to_pk as torch.empty; "
                                  "its reset_parameters initialises it)")
        return {"position": "xl"}
    if src.has(prefix + "pos_to_pk"):
        raise ConversionError(f"parameter {prefix}pos_to_pk: present in a RoPE module (an XL checkpoint?)")
    n_rotate = int(rotate_fraction * dh)  # the official module's rule
    if n_rotate % 2:
        raise ConversionError(f"rotate_fraction {rotate_fraction}: rotates {n_rotate} of {dh} channels, an odd "
                              "count (the official module cannot run it either)")
    fraction = n_rotate / dh
    if rotary_dims({"attention": {"rotate_fraction": fraction, "head_dim": dh}}) != n_rotate:
        raise ConversionError(f"rotate_fraction {rotate_fraction}: {n_rotate} channels not expressible")
    return {"position": "rope", "rotate_fraction": fraction, "rope_base": float(rope_base)}


def sigma_moe_module(src, prefix, k, d_model, selection_mode="sigmoid", activation="relu",
                     activation_after_topk=False):
    """The training code's sigma-MoE layer (layers/moe_layer.py: keys [X, d, F],
    values [X, F, d], expert_sel [X, d]; y = sum_k g_k act(x keys[e]) values[e])."""
    keys = src.take(prefix + "keys")
    if keys.dim() != 3 or keys.shape[1] != d_model:
        raise ConversionError(f"parameter {prefix}keys: expected [n_experts, {d_model}, expert_size], "
                              f"found {list(keys.shape)}")
    X, _, F = keys.shape
    values = src.take(prefix + "values", (X, F, d_model), "v_dim must be d_model")
    sel = src.take(prefix + "expert_sel", (X, d_model))
    for name in ("sel_scale",):
        if src.has(prefix + name):
            raise ConversionError(f"parameter {prefix}{name}: selection normalisation (moe.sel_norm) is not "
                                  "supported")
    if selection_mode == "sigmoid":
        gate = "sigmoid"  # top-k of the sigmoids == of the logits; weights = the sigmoids
    elif selection_mode == "gate" and not activation_after_topk:
        gate = "softmax"  # softmax over all experts, then top-k, not renormalised
    else:
        raise ConversionError(f"selection_mode {selection_mode!r}"
                              f"{' with activation_after_topk' if activation_after_topk else ''}: not supported "
                              "(sigmoid, or gate without activation_after_topk)")
    if activation not in ("relu", "gelu", "silu"):
        raise ConversionError(f"activation {activation!r}: expected relu, gelu or silu")
    if not 1 <= k <= X:
        raise ConversionError(f"k (pkm.n_heads) {k}: expected 1..{X}")
    ffn = {"type": "moe", "d_ff": F, "n_experts": X, "top_k": k, "gate": gate, "renormalize": False,
           "activation": activation, "bias": False, "router_bias": False}
    tensors = {"w1": keys.transpose(1, 2).contiguous(), "w2": values.transpose(1, 2).contiguous(),
               "router.weight": sel}
    return ffn, tensors


# ------------------------------------------------------------- modules mode --
def _expand(pattern, i):
    return pattern.replace("{i}", str(i))


def convert_modules(sd, spec):
    """spec: {"config": {...format config...}, "attention": {"module":
    "SwitchHeadXL"|"SwitchHeadRope", "prefix": "...{i}...", "n_heads", "moe_k",
    ["rotate_fraction", "rope_base"]}, ["ffn": {"module": "sigma_moe", "prefix",
    "k", ["selection_mode", "activation"]}], ["rename": {"source prefix":
    "format prefix"}]} ({i} = layer index). Returns (config, tensors)."""
    src = _Tensors(sd)
    cfg = copy.deepcopy(spec.get("config") or {})
    for key in ("d_model", "n_layers"):
        if key not in cfg:
            raise ConversionError(f"spec config: missing {key}")
    d, n_layers = cfg["d_model"], cfg["n_layers"]
    a = spec.get("attention")
    if not a:
        raise ConversionError("spec: missing attention")
    kinds = {"SwitchHeadXL": "xl", "SwitchHeadRope": "rope"}
    if a.get("module") not in kinds:
        raise ConversionError(f"spec attention.module {a.get('module')!r}: expected one of {sorted(kinds)}")
    for key in ("prefix", "n_heads", "moe_k"):
        if key not in a:
            raise ConversionError(f"spec attention: missing {key}")
    tensors = {}
    attn_cfg = None
    for i in range(n_layers):
        one, t = switchhead_module(src, _expand(a["prefix"], i), a["n_heads"], a["moe_k"], kinds[a["module"]], d,
                                   a.get("rotate_fraction", 0.5), a.get("rope_base", 10000.0))
        if attn_cfg not in (None, one):
            raise ConversionError(f"layer {i}: attention differs from layer 0 ({one} vs {attn_cfg})")
        attn_cfg = one
        tensors.update({f"layers.{i}.attn.{k}": v for k, v in t.items()})
    given = cfg.get("attention", {})
    for key, value in given.items():
        if attn_cfg.get(key, value) != value:
            raise ConversionError(f"spec config attention.{key} {value!r}: the module says {attn_cfg[key]!r}")
    cfg["attention"] = dict(given, **attn_cfg)
    f = spec.get("ffn")
    if f:
        if f.get("module") != "sigma_moe":
            raise ConversionError(f"spec ffn.module {f.get('module')!r}: expected \"sigma_moe\"")
        ffn_cfg = None
        for i in range(n_layers):
            one, t = sigma_moe_module(src, _expand(f["prefix"], i), f["k"], d, f.get("selection_mode", "sigmoid"),
                                      f.get("activation", "relu"))
            ffn_cfg = ffn_cfg or one
            if one != ffn_cfg:
                raise ConversionError(f"layer {i}: sigma-MoE differs from layer 0")
            tensors.update({f"layers.{i}.ffn.{k}": v for k, v in t.items()})
        cfg["ffn"] = ffn_cfg
    renames = []
    for old, new in (spec.get("rename") or {}).items():
        if "{i}" in old:
            renames += [(_expand(old, i), _expand(new, i)) for i in range(n_layers)]
        else:
            renames.append((old, new))
    for name in sorted(src.sd):
        if name in src.used:
            continue
        target = name
        for old, new in renames:
            if name.startswith(old):
                target = new + name[len(old):]
                break
        if target in tensors:
            raise ConversionError(f"parameter {name}: maps to {target}, which is already taken")
        if target != name or _is_format_name(target):
            tensors[target] = src.take(name)
    src.finish()
    check_against_format(cfg, tensors)
    return cfg, tensors


def _is_format_name(name):
    return re.match(r"^(embedding|lm_head|final_norm|layers\.\d+\.(attn_norm|ffn_norm|attn|ffn))\.", name) is not None


# ------------------------------------------------------------------ lm mode --
# The training code's defaults for the arguments read here (main.py,
# tasks/simple/language_model/transformer_lm_mixin.py): used when the saved
# arguments lack one.
LM_DEFAULTS = {
    "embedding_size": None, "tied_embedding": False, "transformer.activation": "relu",
    "transformer.head_projection_size": None, "transformer.ln_affine": True,
    "moe.att.enable": False, "moe.att.variant": "moa", "moe.att.selection_mode": "sigmoid",
    "moe.att.q_expert": True, "moe.att.k_expert": True, "moe.att.v_expert": True, "moe.att.o_expert": True,
    "moe.att.k": 2, "moe.att.n_experts": 4, "moe.att.v_size": None, "moe.att.same_sel": False,
    "moe.att.qside_n_experts": None, "moe.att.shared_experts": False, "moe.att.norm_ret": False,
    "rope.rotate_fraction": 0.5, "rope.base": 10000.0, "moe.selection_mode": "sigmoid", "moe.sel_norm": "none",
    "moe.topk_mode": "full", "moe.norm_keys": False, "moe.activation_after_topk": False, "pkm.n_heads": 1,
    "lm.unroll": None, "lm.trafo.context_blocks": 1,
}


def _arg(args, key):
    if key in args:
        v = args[key]
    elif key in LM_DEFAULTS:
        v = LM_DEFAULTS[key]
    else:
        raise ConversionError(f"argument {key}: missing")
    # int_or_none arguments may be saved as the string "none"
    return None if key in _INT_OR_NONE and isinstance(v, str) and v.lower() == "none" else v


_INT_OR_NONE = {"embedding_size", "transformer.head_projection_size", "moe.att.v_size", "moe.att.qside_n_experts",
                "lm.unroll"}


def convert_lm(sd, args, tokenizer="byte", max_seq_len=None, name=""):
    """The training code's TransformerLanguageModel -> (config, tensors)."""
    src = _Tensors(sd)
    variant = _arg(args, "transformer.variant")
    if variant not in ("preln_moe", "preln_moeatt"):
        raise ConversionError(f"argument transformer.variant {variant!r}: supported are preln_moe and "
                              "preln_moeatt (pre-LayerNorm SwitchHead models)")
    for key in ("embedding_size",):
        if _arg(args, key) is not None or src.has("embedding_adapter.weight"):
            raise ConversionError("parameter embedding_adapter.weight / argument embedding_size: a separate "
                                  "embedding size is not supported")
    emb = src.take("embedding.weight")
    V, d = emb.shape
    if _arg(args, "state_size") != d:
        raise ConversionError(f"argument state_size {_arg(args, 'state_size')}: embedding.weight has width {d}")
    n_layers = _arg(args, "transformer.encoder_n_layers")
    found = {int(m.group(1)) for k in src.sd for m in [re.match(r"unique_layers\.(\d+)\.", k)] if m}
    if found != set(range(n_layers)):
        raise ConversionError(f"argument transformer.encoder_n_layers {n_layers}: the state dict has layers "
                              f"{sorted(found)} (shared layers are not supported)")
    H = _arg(args, "transformer.n_heads")
    dh = _arg(args, "transformer.head_projection_size") or d // H
    act = _arg(args, "transformer.activation")
    if act not in ("relu", "gelu"):
        raise ConversionError(f"argument transformer.activation {act!r}: expected relu or gelu")
    tensors, attn_cfg, ffn_cfg = {}, None, None
    for i in range(n_layers):
        p = f"unique_layers.{i}."
        one, t = _lm_attention(src, args, p + "self_attn.", H, dh, d)
        attn_cfg = attn_cfg or one
        tensors.update({f"layers.{i}.attn.{k}": v for k, v in t.items()})
        if variant == "preln_moe":
            one_f, t = _lm_sigma_moe(src, args, p + "pkm.", d, act)
        else:
            F = src.take(p + "linear1.weight").shape[0]
            t = {"w1.weight": src.take(p + "linear1.weight", (F, d)), "w1.bias": src.take(p + "linear1.bias", (F,)),
                 "w2.weight": src.take(p + "linear2.weight", (d, F)), "w2.bias": src.take(p + "linear2.bias", (d,))}
            one_f = {"type": "dense", "d_ff": F, "activation": act, "bias": True}
        ffn_cfg = ffn_cfg or one_f
        tensors.update({f"layers.{i}.ffn.{k}": v for k, v in t.items()})
        affine = variant == "preln_moeatt" or _arg(args, "transformer.ln_affine")
        for ours, theirs in (("attn_norm", "norm1"), ("ffn_norm", "norm2")):
            tensors.update(_layernorm(src, p + theirs, f"layers.{i}.{ours}", d, affine))
    tensors.update(_layernorm(src, "out_norm", "final_norm", d, True))
    tied = bool(_arg(args, "tied_embedding"))
    out_w = src.take("output.weight", (V, d))
    if tied and not torch.equal(out_w, emb):
        raise ConversionError("parameter output.weight: differs from embedding.weight although tied_embedding")
    tensors["embedding.weight"] = emb
    if not tied:
        tensors["lm_head.weight"] = out_w
    output_bias = src.has("output.bias")
    if output_bias:
        tensors["lm_head.bias"] = src.take("output.bias", (V,))
    src.finish()
    if max_seq_len is None:
        unroll = _arg(args, "lm.unroll")
        if unroll is None:
            raise ConversionError("argument lm.unroll missing: give --max-seq-len")
        max_seq_len = unroll * (1 + (_arg(args, "lm.trafo.context_blocks") or 0))
    cfg = {"format_version": 1, "name": name, "vocab_size": V, "d_model": d, "n_layers": n_layers,
           "max_seq_len": int(max_seq_len), "norm": "layernorm", "norm_eps": 1e-5, "tie_embeddings": tied,
           "output_bias": output_bias, "tokenizer": tokenizer, "attention": attn_cfg, "ffn": ffn_cfg}
    check_against_format(cfg, tensors)
    return cfg, tensors


def _layernorm(src, theirs, ours, d, affine):
    if not affine:
        for suffix in ("weight", "bias"):
            if src.has(f"{theirs}.{suffix}"):
                raise ConversionError(f"parameter {theirs}.{suffix}: present although transformer.ln_affine is false")
        return {f"{ours}.weight": torch.ones(d, dtype=torch.float64),
                f"{ours}.bias": torch.zeros(d, dtype=torch.float64)}
    return {f"{ours}.weight": src.take(f"{theirs}.weight", (d,)), f"{ours}.bias": src.take(f"{theirs}.bias", (d,))}


def _lm_attention(src, args, p, H, dh, d):
    """FullMoeRelativeAttention ("full", XL) / FullMoeRopeAttention ("full_rope")."""
    if not _arg(args, "moe.att.enable"):
        raise ConversionError("argument moe.att.enable is false: the dense relative attention "
                              "(FixedRelativeMultiheadAttention, with u/v biases) is not supported")
    variant = _arg(args, "moe.att.variant")
    if variant not in ("full", "full_rope"):
        raise ConversionError(f"argument moe.att.variant {variant!r}: supported are full (XL) and full_rope")
    for key in ("q", "k"):
        if _arg(args, f"moe.att.{key}_expert"):
            raise ConversionError(f"argument moe.att.{key}_expert: expert {key} projections are not supported "
                                  f"(parameter {p}projections.{key} would be [experts, d, dh])")
    if _arg(args, "moe.att.norm_ret") or src.has(p + "norm_ret.weight"):
        raise ConversionError(f"parameter {p}norm_ret.weight / argument moe.att.norm_ret: not supported")
    v_size = _arg(args, "moe.att.v_size")
    if v_size not in (None, dh):
        raise ConversionError(f"argument moe.att.v_size {v_size}: must equal the head size {dh}")
    out = {"q.weight": src.take(p + "projections.q", (H * dh, d)),
           "k.weight": src.take(p + "projections.k", (H * dh, d))}
    v_exp, o_exp = _arg(args, "moe.att.v_expert"), _arg(args, "moe.att.o_expert")
    gate = {"sigmoid": "sigmoid", "softmax": "softmax_topk"}.get(_arg(args, "moe.att.selection_mode"))
    if gate is None:
        raise ConversionError(f"argument moe.att.selection_mode {_arg(args, 'moe.att.selection_mode')!r}")
    if v_exp and o_exp:
        E = _arg(args, "moe.att.n_experts")
        if _arg(args, "moe.att.qside_n_experts") not in (None, E):
            raise ConversionError("argument moe.att.qside_n_experts: output experts must number moe.att.n_experts")
        if E < 2:
            raise ConversionError(f"argument moe.att.n_experts {E}: at least 2 (one expert gates V and O, which the "
                                  "format's n_experts 1 does not)")
        k = _arg(args, "moe.att.k")
        shared = _arg(args, "moe.att.shared_experts")
        rows = E if shared else H * E
        v = src.take(p + "projections.v", (rows, d, dh))
        o = src.take(p + "projections.o", (rows, dh, d))
        out["v"] = v.repeat(H, 1, 1) if shared else v
        out["o"] = o.repeat(H, 1, 1) if shared else o
        out["sel_o"] = src.take(p + "selections.o", (H * E, d))
        # moe.att.same_sel reaches preln_moe's XL attention but not its
        # full_rope one, which keeps its own selections.v: O's selections
        # stand in for V's only where the checkpoint has none.
        if src.has(p + "selections.v") or not _arg(args, "moe.att.same_sel"):
            out["sel_v"] = src.take(p + "selections.v", (H * E, d))
        else:
            out["sel_v"] = out["sel_o"].clone()
        cfg = {"type": "switchhead", "n_heads": H, "n_kv_heads": H, "head_dim": dh, "n_experts": E,
               "top_k": k, "gate": gate}
    elif not v_exp and not o_exp:
        out["v.weight"] = src.take(p + "projections.v", (H * dh, d))
        out["o.weight"] = src.take(p + "projections.o", (d, H * dh))
        cfg = {"type": "dense", "n_heads": H, "n_kv_heads": H, "head_dim": dh}
    else:
        raise ConversionError("arguments moe.att.v_expert / o_expert: experts on one side only are not supported")
    position = "xl" if variant == "full" else "rope"
    cfg.update(_position(src, p, position, H, dh, d, _arg(args, "rope.rotate_fraction"), _arg(args, "rope.base"),
                         out))
    return cfg, out


def _lm_sigma_moe(src, args, p, d, act):
    for key, ok in (("moe.sel_norm", "none"), ("moe.topk_mode", "full")):
        if _arg(args, key) != ok:
            raise ConversionError(f"argument {key} {_arg(args, key)!r}: only {ok!r} is supported")
    if _arg(args, "moe.norm_keys"):
        raise ConversionError("argument moe.norm_keys: keys renormalised by the training loop are not supported")
    return sigma_moe_module(src, p, _arg(args, "pkm.n_heads"), d, _arg(args, "moe.selection_mode"), act,
                            _arg(args, "moe.activation_after_topk"))


# -------------------------------------------------------------------- write --
def write_model(out_dir, cfg, tensors, dtype="f32", tokenizer_model=None):
    store = {"f32": torch.float32, "f16": torch.float16, "bf16": torch.bfloat16}[dtype]
    try:  # before anything is written: a weight --dtype cannot hold is refused
        stored = cast_for_storage(tensors, store)
    except ValueError as e:
        raise ConversionError(f"--dtype {dtype}: {e}") from e
    os.makedirs(out_dir, exist_ok=True)
    with open(os.path.join(out_dir, "config.json"), "w") as f:
        json.dump(cfg, f, indent=2)
        f.write("\n")
    save_file({k: v.contiguous() for k, v in stored.items()},
              os.path.join(out_dir, "model.safetensors"), metadata={"converted_by": "tools/convert_official.py"})
    if tokenizer_model:
        shutil.copy(tokenizer_model, os.path.join(out_dir, "tokenizer.model"))


def main(argv=None):
    ap = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    ap.add_argument("source", choices=["lm", "modules"])
    ap.add_argument("--checkpoint", required=True, help="state dict (torch file or .safetensors) or checkpoint")
    ap.add_argument("--args", help="lm: the run's arguments as JSON (default: those saved in the checkpoint)")
    ap.add_argument("--spec", help="modules: the mapping spec (JSON)")
    ap.add_argument("--tokenizer", default="byte", choices=["byte", "sentencepiece"])
    ap.add_argument("--tokenizer-model", help="SentencePiece model, copied into the directory")
    ap.add_argument("--max-seq-len", type=int)
    ap.add_argument("--name", default="")
    ap.add_argument("--dtype", default="f32", choices=["f32", "f16", "bf16"])
    ap.add_argument("--out", required=True)
    a = ap.parse_args(argv)
    try:
        sd, saved_args = load_checkpoint(a.checkpoint)
        if a.source == "lm":
            args = json.load(open(a.args)) if a.args else saved_args
            if args is None:
                raise ConversionError("no training arguments: give --args (the run's run_invariants['args'])")
            if (a.tokenizer == "sentencepiece") != bool(a.tokenizer_model):
                raise ConversionError("--tokenizer sentencepiece needs --tokenizer-model, and only it")
            cfg, tensors = convert_lm(sd, args, a.tokenizer, a.max_seq_len, a.name)
        else:
            if not a.spec:
                raise ConversionError("modules: --spec is required")
            # The spec's config says these; a flag would be dropped unseen.
            for flag, given in (("--name", a.name), ("--max-seq-len", a.max_seq_len is not None),
                                ("--tokenizer", a.tokenizer != "byte")):
                if given:
                    raise ConversionError(f"modules: {flag} is for lm; the spec's \"config\" sets it")
            cfg, tensors = convert_modules(sd, json.load(open(a.spec)))
            if (cfg.get("tokenizer", "byte") == "sentencepiece") != bool(a.tokenizer_model):
                raise ConversionError("modules: --tokenizer-model goes with a spec config whose "
                                      "tokenizer is sentencepiece, and only with it")
        write_model(a.out, cfg, tensors, a.dtype, a.tokenizer_model)
    except ConversionError as e:
        print(f"convert_official.py: {e}", file=sys.stderr)
        return 2
    print(f"wrote {a.out}: {len(tensors)} tensors, {cfg['n_layers']} layers, attention "
          f"{cfg['attention']['type']} position {cfg['attention'].get('position', 'rope')}, ffn {cfg['ffn']['type']}")
    return 0


if __name__ == "__main__":
    sys.exit(main())

"""What it takes to run the official SwitchHead code on a CPU with the
PyTorch at hand, for check_official.py:

- `cvmm` module stand-in: the official code multiplies by its experts with a
  Triton GPU kernel (`cvmm`). This is a plain-PyTorch implementation of the
  same contract (CVMMSel, cvmm_prepare_sel, cvmm_prepare_sel2, cvmm): for
  every entry m of the sorted selection, output row out_index[m] (sel_index[m]
  when out_index is None) = input row sel_index[m] @ keys[sel[m]]; with a
  reduction_weight, the outputs are then summed with those weights over its
  last dimension. The result has the input's dtype (the kernel's float32
  outside autocast).
- PyTorch < 2.1 compatibility, used only where the running PyTorch lacks it:
  `torch.no_grad` as a bare decorator, and
  `F.scaled_dot_product_attention` (boolean mask True = attend; `scale`).
"""
import contextlib
import math
import types
from dataclasses import dataclass
from typing import Optional

import torch
import torch.nn.functional as F


@dataclass
class CVMMSel:
    raw_sel: torch.Tensor
    sel: torch.Tensor
    sel_index: torch.Tensor
    out_index: Optional[torch.Tensor] = None
    reduction_weight: Optional[torch.Tensor] = None

    def clone(self):
        return CVMMSel(self.raw_sel, self.sel, self.sel_index, self.out_index, self.reduction_weight)


def cvmm_prepare_sel(sel, n_experts=None):
    """One expert per input row: rows in expert order."""
    ssel, order = sel.flatten().sort()
    return CVMMSel(sel, ssel.view_as(sel), order, None)


def cvmm_prepare_sel2(sel, w=None):
    """sel [..., n]: n experts per input row; output row = flat position in sel."""
    n = sel.shape[-1]
    ssel, order = sel.flatten().sort()
    return CVMMSel(sel, ssel.view_as(sel), order // n, order, w)


def cvmm(x, sel, keys):
    if not isinstance(sel, CVMMSel):
        sel = cvmm_prepare_sel(sel, keys.shape[0])
    rows = x.flatten(end_dim=-2)
    expert = sel.sel.flatten().long()
    src = sel.sel_index.flatten().long()
    dst = (sel.out_index if sel.out_index is not None else sel.sel_index).flatten().long()
    out = rows.new_zeros(expert.numel(), keys.shape[-1])
    out[dst] = torch.einsum("mk,mkn->mn", rows[src], keys[expert].to(rows.dtype))
    res = out.view(*sel.sel.shape, keys.shape[-1])
    if sel.reduction_weight is not None:
        res = res.view(*sel.reduction_weight.shape, res.shape[-1])
        res = (sel.reduction_weight.unsqueeze(-2).type_as(res) @ res).squeeze(-2)
    return res


def cvmm_module(name):
    m = types.ModuleType(name)
    m.CVMMSel, m.cvmm, m.cvmm_prepare_sel, m.cvmm_prepare_sel2 = CVMMSel, cvmm, cvmm_prepare_sel, cvmm_prepare_sel2
    return m


def _sdpa(q, k, v, attn_mask=None, dropout_p=0.0, is_causal=False, scale=None):
    att = (q @ k.transpose(-2, -1)) * (1.0 / math.sqrt(q.shape[-1]) if scale is None else scale)
    if attn_mask is not None:
        att = att.masked_fill(~attn_mask, float("-inf")) if attn_mask.dtype == torch.bool else att + attn_mask
    return torch.softmax(att, -1) @ v


def _bare_no_grad_works():
    try:
        torch.no_grad(lambda: None)
        return True
    except TypeError:
        return False


@contextlib.contextmanager
def torch_compat():
    """Yields the list of stand-ins it installed; restores torch afterwards
    (the official module is imported and run inside)."""
    installed = []
    saved_no_grad = torch.no_grad
    had_sdpa = hasattr(F, "scaled_dot_product_attention")
    if not _bare_no_grad_works():
        def no_grad(fn=None):
            return saved_no_grad() if fn is None else saved_no_grad()(fn)
        torch.no_grad = no_grad
        installed.append("torch.no_grad as a bare decorator")
    if not had_sdpa:
        F.scaled_dot_product_attention = _sdpa
        installed.append("F.scaled_dot_product_attention")
    try:
        yield installed
    finally:
        torch.no_grad = saved_no_grad
        if not had_sdpa:
            del F.scaled_dot_product_attention

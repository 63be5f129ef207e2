"""Top-k gating, capacity-aware dispatch and routing statistics (docs/design.md,
docs/model-format.md "dispatch").

One call of `route` handles one router (layer, module, head) for one engine
step: the N tokens given, in step order (sequence order, then position).
"""
import math
from dataclasses import dataclass, field

import torch


@dataclass
class DispatchConfig:
    capacity_factor: float = 0.0  # <= 0: dropless
    min_capacity: int = 0
    overflow: str = "drop"  # "drop" | "reroute"

    def capacity(self, tokens, k, experts):
        """C = max(min_capacity, ceil(cf * T * k / E)); None when dropless."""
        if self.capacity_factor <= 0:
            return None
        slots = math.ceil(self.capacity_factor * tokens * k / experts)
        return max(self.min_capacity, int(slots))


KEPT, REROUTED, DROPPED = 0, 1, 2


@dataclass
class RouteResult:
    expert: torch.Tensor  # [N, k] int64: expert that processed it (original one if dropped)
    gate: torch.Tensor    # [N, k] weight applied (or that would have been)
    fate: torch.Tensor    # [N, k] int64: 0 kept, 1 rerouted, 2 dropped
    weights: torch.Tensor  # [N, E] summed gate weight of kept assignments
    kept_mask: torch.Tensor  # [N, E] bool: token processed by expert e
    logits: torch.Tensor  # [N, E] the router logits (for robustness checks)
    stats: dict = field(default_factory=dict)


def ranking(logits):
    """Experts of each token sorted by descending score; ties -> lower index."""
    return torch.sort(logits, dim=-1, descending=True, stable=True).indices


def gate_values(logits, order, k, gate, renormalize=False):
    """Gate weights [N, k] of the top-k experts, and P(e|t) [N, E] for stats.

    gate: "sigmoid" (SwitchHead / sigma-MoE), "softmax" (Switch FFN: softmax
    over all E, then taken at the chosen experts), "softmax_topk" (softmax
    over the k selected logits).
    """
    top = order[:, :k]
    if gate == "sigmoid":
        s = torch.sigmoid(logits)
        g = torch.gather(s, 1, top)
        prob = s / s.sum(-1, keepdim=True)
    elif gate == "softmax":
        p = torch.softmax(logits, -1)
        g = torch.gather(p, 1, top)
        prob = p
    elif gate == "softmax_topk":
        g = torch.softmax(torch.gather(logits, 1, top), -1)
        prob = torch.softmax(logits, -1)
    else:
        raise ValueError(f"unknown gate {gate}")
    if renormalize:
        g = g / g.sum(-1, keepdim=True)
    return g, prob


def _dropless(order, k, n_experts):
    top = order[:, :k]
    routed = torch.bincount(top.flatten().cpu(), minlength=n_experts).tolist()
    zeros = [0] * n_experts
    counts = dict(routed=routed, kept=list(routed), rerouted=list(zeros), dropped=list(zeros))
    return top.clone(), torch.zeros_like(top), counts


def dispatch(order, k, n_experts, capacity, overflow):
    """Capacity-aware slot filling, rank-major, in step order.

    order: [N, E] ranking per token. Returns (expert [N,k], fate [N,k], counts)
    with counts = dict of routed/kept/rerouted/dropped lists of length E.
    A rerouted assignment goes to the token's next-best expert (by its
    ranking) that is neither among its top-k choices nor already a reroute
    target of this token, and that has a free slot at that moment.
    """
    if capacity is None:
        return _dropless(order, k, n_experts)
    device = order.device
    order = order.tolist()
    n = len(order)
    E = n_experts
    routed = [0] * E
    kept = [0] * E
    rerouted = [0] * E
    dropped = [0] * E
    load = [0] * E
    expert = [[0] * k for _ in range(n)]
    fate = [[KEPT] * k for _ in range(n)]
    taken = [set(order[t][:k]) for t in range(n)]
    for r in range(k):
        for t in range(n):
            e = order[t][r]
            routed[e] += 1
            expert[t][r] = e
            if load[e] < capacity:
                load[e] += 1
                kept[e] += 1
                continue
            target = None
            if overflow == "reroute":
                for cand in order[t][k:]:
                    if cand not in taken[t] and load[cand] < capacity:
                        target = cand
                        break
            if target is None:
                dropped[e] += 1
                fate[t][r] = DROPPED
            else:
                taken[t].add(target)
                load[target] += 1
                kept[target] += 1
                rerouted[e] += 1
                expert[t][r] = target
                fate[t][r] = REROUTED
    counts = dict(routed=routed, kept=kept, rerouted=rerouted, dropped=dropped)
    return (torch.tensor(expert, dtype=torch.int64, device=device).reshape(n, k),
            torch.tensor(fate, dtype=torch.int64, device=device).reshape(n, k), counts)


def route(logits, k, gate, dispatch_cfg, renormalize=False):
    """Routes N tokens (one step) through one router with [N, E] logits."""
    n, E = logits.shape
    order = ranking(logits)
    g, prob = gate_values(logits, order, k, gate, renormalize)
    cap = dispatch_cfg.capacity(n, k, E)
    expert, fate, counts = dispatch(order, k, E, cap, dispatch_cfg.overflow)
    keep = fate != DROPPED
    weights = torch.zeros(n, E, dtype=logits.dtype, device=logits.device)
    kept_mask = torch.zeros(n, E, dtype=torch.bool, device=logits.device)
    if n:
        weights.scatter_add_(1, expert, torch.where(keep, g, torch.zeros_like(g)))
        kept_mask.scatter_(1, expert, keep)
    prob_sum = prob.to(torch.float64).sum(0)
    routed = torch.tensor(counts["routed"], dtype=torch.float64, device=logits.device)
    aux = 0.0
    if n:
        aux = float(E * ((routed / (n * k)) * (prob_sum / n)).sum())
    stats = dict(tokens=n, routed=counts["routed"], kept=counts["kept"],
                 rerouted=counts["rerouted"], dropped=counts["dropped"],
                 prob_sum=prob_sum.tolist(), aux_loss=aux, capacity=cap)
    return RouteResult(expert=expert, gate=g, fate=fate, weights=weights,
                       kept_mask=kept_mask, logits=logits, stats=stats)

"""Top-k gating, capacity-aware dispatch and routing statistics (DESIGN.md,
docs/model-format.md "dispatch").

One call of `route` handles one router (layer, module, head) for one engine
step: the N tokens given, in step order (sequence order, then position).

Two capacity scopes:
- "sequence" (the default): capacity per sequence and aligned group of
  `capacity_group` positions, filled in position order (each position's k
  choices in rank order). A token's fate depends only on the earlier positions
  of its own group, so it is the same however the sequence was batched or
  chunked; a running sequence carries its current group's per-expert counts
  from step to step (`SequenceSlots`).
- "step": capacity over all T tokens of the step, filled rank-major in step
  order (the Switch Transformer training rule; lets requests affect each other).
"""
import math
from dataclasses import dataclass, field

import torch


SCOPES = ("sequence", "step")
DEFAULT_CAPACITY_GROUP = 128


@dataclass
class DispatchConfig:
    capacity_factor: float = 0.0  # <= 0: dropless
    min_capacity: int = 0
    overflow: str = "drop"  # "drop" | "reroute"
    capacity_scope: str = "sequence"  # "sequence" | "step"
    capacity_group: int = DEFAULT_CAPACITY_GROUP  # G, positions per group (sequence scope)

    def __post_init__(self):
        if self.capacity_scope not in SCOPES:
            raise ValueError(f"capacity_scope must be one of {SCOPES}, found {self.capacity_scope!r}")
        if self.overflow not in ("drop", "reroute"):
            raise ValueError(f"overflow must be drop or reroute, found {self.overflow!r}")
        if isinstance(self.capacity_group, bool) or not isinstance(self.capacity_group, int) \
                or self.capacity_group < 1:
            raise ValueError(f"capacity_group must be an integer >= 1, found {self.capacity_group!r}")

    @property
    def dropless(self):
        return self.capacity_factor <= 0

    def capacity(self, tokens, k, experts):
        """C = max(min_capacity, ceil(cf * T * k / E)); None when dropless.
        T is the step's tokens (step scope) or G (sequence scope)."""
        if self.capacity_factor <= 0:
            return None
        slots = math.ceil(self.capacity_factor * tokens * k / experts)
        return max(self.min_capacity, int(slots))

    def slots_per_expert(self, step_tokens, k, experts):
        """The capacity this config gives one router: per group of G positions
        (sequence scope) or per step of `step_tokens` tokens (step scope)."""
        if self.capacity_scope == "sequence":
            return self.capacity(self.capacity_group, k, experts)
        return self.capacity(step_tokens, k, experts)


class SequenceSlots:
    """Per-sequence capacity state of ONE router under sequence scope: for each
    sequence (batch row), the group it is in and that group's per-expert loads.
    Lives in the KV cache of the sequence; reset at each group boundary."""

    def __init__(self):
        self.by_sequence = {}  # seq -> (group index, [load per expert])

    def loads(self, seq, group, n_experts):
        cur = self.by_sequence.get(seq)
        if cur is None or cur[0] != group:
            cur = (group, [0] * n_experts)
            self.by_sequence[seq] = cur
        return cur[1]


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


class _Filler:
    """Slot filling shared by both scopes: one assignment at a time, against
    the `load` list of whichever scope the caller is in."""

    def __init__(self, order, k, n_experts, capacity, overflow):
        self.order, self.k, self.E = order, k, n_experts
        self.capacity, self.reroute = capacity, overflow == "reroute"
        n = len(order)
        self.counts = {key: [0] * n_experts for key in ("routed", "kept", "rerouted", "dropped")}
        self.expert = [[0] * k for _ in range(n)]
        self.fate = [[KEPT] * k for _ in range(n)]
        self.taken = [set(order[t][:k]) for t in range(n)]

    def place(self, t, r, load):
        """Places token t's rank-r choice. A rerouted assignment goes to the
        token's next-best expert (by its ranking) that is neither among its
        top-k choices nor already a reroute target of this token, and that
        has a free slot in `load` at that moment."""
        c, cap = self.counts, self.capacity
        e = self.order[t][r]
        c["routed"][e] += 1
        self.expert[t][r] = e
        if load[e] < cap:
            load[e] += 1
            c["kept"][e] += 1
            return
        target = None
        if self.reroute:
            for cand in self.order[t][self.k:]:
                if cand not in self.taken[t] and load[cand] < cap:
                    target = cand
                    break
        if target is None:
            c["dropped"][e] += 1
            self.fate[t][r] = DROPPED
        else:
            self.taken[t].add(target)
            load[target] += 1
            c["kept"][target] += 1
            c["rerouted"][e] += 1
            self.expert[t][r] = target
            self.fate[t][r] = REROUTED

    def result(self, device):
        n = len(self.order)
        return (torch.tensor(self.expert, dtype=torch.int64, device=device).reshape(n, self.k),
                torch.tensor(self.fate, dtype=torch.int64, device=device).reshape(n, self.k), self.counts)


def dispatch(order, k, n_experts, capacity, overflow):
    """Step scope: capacity-aware slot filling, rank-major, in step order.

    order: [N, E] ranking per token. Returns (expert [N,k], fate [N,k], counts)
    with counts = dict of routed/kept/rerouted/dropped lists of length E.
    """
    if capacity is None:
        return _dropless(order, k, n_experts)
    device = order.device
    fill = _Filler(order.tolist(), k, n_experts, capacity, overflow)
    load = [0] * n_experts
    for r in range(k):
        for t in range(len(fill.order)):
            fill.place(t, r, load)
    return fill.result(device)


def dispatch_sequence(order, k, n_experts, capacity, overflow, seq, pos, group_size, slots=None):
    """Sequence scope: per sequence and aligned group of `group_size`
    positions, `capacity` slots per expert, filled in position order, each
    position's k choices in rank order.

    seq, pos: [N] sequence id (batch row) and absolute position of each token.
    slots: SequenceSlots of this router, carrying each sequence's current group
    loads from earlier steps (updated in place); None = no earlier steps.
    Returns the same triple as `dispatch`.
    """
    if capacity is None:
        return _dropless(order, k, n_experts)
    device = order.device
    slots = SequenceSlots() if slots is None else slots
    fill = _Filler(order.tolist(), k, n_experts, capacity, overflow)
    seq, pos = [int(v) for v in seq], [int(v) for v in pos]
    for t in sorted(range(len(seq)), key=lambda i: (seq[i], pos[i])):
        load = slots.loads(seq[t], pos[t] // group_size, n_experts)
        for r in range(k):
            fill.place(t, r, load)
    return fill.result(device)


def route(logits, k, gate, dispatch_cfg, renormalize=False, seq=None, pos=None, slots=None):
    """Routes N tokens (one step) through one router with [N, E] logits.

    Sequence scope needs each token's sequence id and position (`seq`, `pos`,
    [N]; default: one sequence at positions 0..N-1) and the router's
    SequenceSlots carried from earlier steps (`slots`; default: none)."""
    n, E = logits.shape
    order = ranking(logits)
    g, prob = gate_values(logits, order, k, gate, renormalize)
    cap = dispatch_cfg.slots_per_expert(n, k, E)
    if dispatch_cfg.capacity_scope == "sequence":
        seq = [0] * n if seq is None else seq
        pos = list(range(n)) if pos is None else pos
        expert, fate, counts = dispatch_sequence(order, k, E, cap, dispatch_cfg.overflow, seq, pos,
                                                 dispatch_cfg.capacity_group, slots)
    else:
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
                 prob_sum=prob_sum.tolist(), aux_loss=aux, capacity=cap,
                 capacity_scope=dispatch_cfg.capacity_scope)
    return RouteResult(expert=expert, gate=g, fate=fate, weights=weights,
                       kept_mask=kept_mask, logits=logits, stats=stats)

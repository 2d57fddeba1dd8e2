"""Parallel plans: how one model replica is spread over GPUs.

Degrees follow vLLM / aiconfigurator semantics:
- attention and dense layers: `tp` tensor parallel x `dp` attention data parallel (DEP when
  dp > 1 with expert parallelism), x `pcp` prefill context parallel ranks;
- MoE layers: the same GPUs regrouped as `moe_tp` x `ep` (moe_tp * ep == tp * dp * pcp);
- `dcp` decode context parallel shards the KV along the sequence inside the TP group
  (dcp divides tp; KV is not duplicated across those ranks);
- `pp` pipeline stages multiply everything; `sp` shards norms/activations along tokens in TP;
- `redundant_experts` extra physical copies of routed experts (EPLB): each EP rank holds
  (experts + redundant) / ep of them (vLLM `--enable-eplb --eplb-config
  '{"num_redundant_experts": N}'`, SGLang `--ep-num-redundant-experts N`, TensorRT-LLM
  `num_slots`), and the balancer evens the ranks' load (model.perf.expert_balance).

Engines that write attention data parallelism inside their tp (SGLang `--tp N
--enable-dp-attention --dp D`, TensorRT-LLM `tp_size: N` with `enable_attention_dp`) map to
tp = N / D, dp = D here (`attention_dp_plan`).

This module adds the rules on top: validity, sharding of weights / KV / compute, and the
collectives each plan adds per layer (vLLM docs/serving/data_parallel_deployment.md,
expert_parallel_deployment.md, context_parallel_deployment.md).
"""

from __future__ import annotations

import re
from dataclasses import dataclass, replace
from functools import lru_cache

import numpy as np

from model.perf.ops import entry_elements, grouped_layers
from model.specs.dtypes import dtype
from model.specs.errors import Infeasible, ServecastError
from model.specs.layers import Architecture, Attention, Layer, Linear


@dataclass(frozen=True)
class ParallelPlan:
    tp: int = 1
    pp: int = 1
    dp: int = 1
    ep: int = 1
    moe_tp: int = 1
    pcp: int = 1
    dcp: int = 1
    sp: bool = False
    redundant_experts: int = 0

    def __post_init__(self) -> None:
        for name in ("tp", "pp", "dp", "ep", "moe_tp", "pcp", "dcp"):
            value = getattr(self, name)
            if isinstance(value, bool) or not isinstance(value, (int, np.integer)) or value < 1:
                raise ServecastError(f"parallel plan: {name}: must be an integer >= 1, got "
                                     f"{value!r}")
        r = self.redundant_experts
        if isinstance(r, bool) or not isinstance(r, (int, np.integer)) or r < 0:
            raise ServecastError(f"parallel plan: redundant_experts: must be an integer >= 0, "
                                 f"got {r!r}")

    @property
    def attention_gpus(self) -> int:
        """GPUs in one pipeline stage."""
        return self.tp * self.dp * self.pcp

    @property
    def gpus(self) -> int:
        return self.attention_gpus * self.pp

    def label(self) -> str:
        parts = [f"{k}{v}" for k, v in (("tp", self.tp), ("pp", self.pp), ("dp", self.dp),
                 ("ep", self.ep), ("moetp", self.moe_tp), ("pcp", self.pcp), ("dcp", self.dcp))
                 if v > 1]
        parts += [f"eplb{self.redundant_experts}"] if self.redundant_experts else []
        return "-".join(parts + (["sp"] if self.sp else [])) or "single"


# ---- helpers on the architecture ----------------------------------------------------------------
def is_moe(arch: Architecture) -> bool:
    return any(layer.mlp.experts is not None for layer in arch.main_layers)


def _first(arch: Architecture, pred):
    return next((layer for layer in arch.main_layers if pred(layer)), None)


def kv_heads_effective(att: Attention) -> int:
    """KV heads that TP can split: MLA-family and linear state have one shared latent (K = 1)."""
    if att.kind in ("mla", "dsa", "csa", "hca") or att.kv_lora_rank:
        return 1
    if att.kind == "linear":
        return max(att.num_heads, 1)  # per-head recurrent states split cleanly over TP
    return max(att.num_kv_heads, 1)


def normalize_plan(arch: Architecture, plan: ParallelPlan) -> ParallelPlan:
    """Fill the MoE grouping the way vLLM does when only attention degrees are given.

    Without `--enable-expert-parallel` vLLM shards experts with TP over all tp*dp*pcp GPUs; a
    dense model has no MoE group, so moe_tp/ep follow the attention group size.
    """
    g = plan.attention_gpus
    if plan.moe_tp * plan.ep == 1 and g > 1:
        return replace(plan, moe_tp=g)
    if not is_moe(arch) and plan.ep == 1 and plan.moe_tp != g:
        return replace(plan, moe_tp=g)
    return plan


def routed_experts(arch: Architecture) -> int:
    """Logical routed experts per MoE layer (0 for a dense model)."""
    layer = _first(arch, lambda ly: ly.mlp.experts is not None)
    return 0 if layer is None else layer.mlp.experts.num_experts


def experts_per_rank(num_experts: int, plan: ParallelPlan) -> float:
    """Physical experts one EP rank holds: (logical + redundant) / ep."""
    return (num_experts + plan.redundant_experts) / plan.ep


def redundant_choices(experts: int, ep: int, count: int = 4) -> list[int]:
    """The smallest redundant-expert counts that make experts + redundant divide by ep (0 first
    where it already does)."""
    first = (-experts) % ep
    return [first + i * ep for i in range(count)]


def check_redundant_experts(arch: Architecture, plan: ParallelPlan,
                            flag: str = "--redundant-experts") -> None:
    """A redundant-expert count the plan can hold, else one line naming `flag` and the counts
    it allows: 0 without expert parallelism, else those that make experts + redundant a
    multiple of ep (vLLM, SGLang and TensorRT-LLM all place physical experts evenly)."""
    r = plan.redundant_experts
    if r == 0:  # the plan's own validity (validate_plan) speaks for the experts' divisibility
        return
    experts = routed_experts(arch)
    if experts == 0:
        raise ServecastError(f"{flag} {r}: {arch.name} has no routed experts; allowed: 0")
    if plan.ep == 1:
        raise ServecastError(f"{flag} {r}: redundant experts need expert parallelism (ep > 1); "
                             f"allowed with ep=1: 0")
    if (experts + r) % plan.ep:
        choices = ", ".join(map(str, redundant_choices(experts, plan.ep)))
        raise ServecastError(f"{flag} {r}: {experts} + {r} experts not divisible by ep="
                             f"{plan.ep}; allowed: {choices}, ... ({experts} + N a multiple of "
                             f"{plan.ep})")


def attention_dp_plan(tp: int, dp: int = 1, ep: int = 1, pp: int = 1,
                      redundant_experts: int = 0) -> ParallelPlan:
    """A plan written as engines write attention data parallelism: `tp` counts every GPU of the
    stage, `dp` of them run attention data-parallel (SGLang `--tp N --enable-dp-attention --dp
    D`; TensorRT-LLM `enable_attention_dp` is dp = tp, its default here when dp is 1), each with
    whole heads for its own sequences and tp / dp attention ranks; the routed experts run over
    all tp GPUs, `ep`-way expert parallel and tp / ep tensor parallel."""
    dp = tp if dp == 1 else dp
    for name, value in (("dp", dp), ("ep", ep)):
        if value < 1 or tp % value:
            raise ServecastError(f"attention data parallelism: {name} {value} must divide tp "
                                 f"{tp}; allowed: the divisors of {tp}")
    return ParallelPlan(tp=tp // dp, pp=pp, dp=dp, ep=ep, moe_tp=tp // ep,
                        redundant_experts=redundant_experts)


# ---- validity ----------------------------------------------------------------------------------
def validate_plan(arch: Architecture, hw, plan: ParallelPlan,
                  cross_domain_tp: bool = False) -> None:
    """Raise Infeasible naming the first rule the plan breaks.

    TP beyond the scale-up domain is refused unless `cross_domain_tp` (measured runs exist that
    do it; its all-reduces then run over the scale-out network)."""
    p = plan
    for name in ("tp", "pp", "dp", "ep", "moe_tp", "pcp", "dcp"):
        if getattr(p, name) < 1:
            raise Infeasible(f"plan {p.label()}: {name} must be >= 1")
    if p.moe_tp * p.ep != p.attention_gpus:
        raise Infeasible(f"plan {p.label()}: moe_tp*ep = {p.moe_tp * p.ep} must equal "
                         f"tp*dp*pcp = {p.attention_gpus}")
    if not is_moe(arch) and p.ep > 1:
        raise Infeasible(f"plan {p.label()}: ep={p.ep} but {arch.name} has no routed experts")
    if p.redundant_experts and p.ep == 1:
        raise Infeasible(f"plan {p.label()}: redundant experts need expert parallelism (ep > 1), "
                         f"got ep=1")
    if tp_crosses_domain(p, hw) and not cross_domain_tp:
        raise Infeasible(f"plan {p.label()}: tp={p.tp} exceeds the scale-up domain of "
                         f"{_domain(hw)} GPUs on {getattr(hw, 'name', 'this chip')} (an "
                         f"explicit --deployment may place it across domains)")
    if p.pp > len(arch.main_layers):
        raise Infeasible(f"plan {p.label()}: pp={p.pp} exceeds {len(arch.main_layers)} layers")
    for layer, _ in grouped_layers(arch.main_layers):
        att = layer.attention
        if att.num_heads % p.tp:
            raise Infeasible(f"plan {p.label()}: {att.num_heads} attention heads not divisible "
                             f"by tp={p.tp} (engines that count attention-DP ranks in tp run "
                             f"them as dp here: --attention-dp)")
        kv = kv_heads_effective(att)
        if att.kind not in ("linear",) and kv > 1:
            if kv >= p.tp and kv % p.tp:
                raise Infeasible(f"plan {p.label()}: {kv} KV heads not divisible by tp={p.tp}")
            if kv < p.tp and p.tp % kv:
                raise Infeasible(f"plan {p.label()}: tp={p.tp} not a multiple of {kv} KV heads")
        if p.pcp > 1 and att.kind == "linear":
            # a recurrent state runs along the whole sequence: PCP needs it handed from rank to
            # rank, which vLLM and SGLang do not do (vLLM rejects CP for hybrid layouts; SGLang's
            # KDA CP prefill, PR #34059, is unmerged)
            raise Infeasible(f"plan {p.label()}: pcp={p.pcp} splits the sequence of "
                             f"{att.kind} attention layers, whose state no engine hands across "
                             f"ranks; pcp must be 1 for {arch.name}")
        if p.dcp > 1:
            if p.tp % p.dcp:
                raise Infeasible(f"plan {p.label()}: dcp={p.dcp} must divide tp={p.tp}")
            dup = max(p.tp // min(p.tp, kv), 1) if att.kind != "linear" else 1
            if att.kind != "linear" and (dup < p.dcp or dup % p.dcp):
                raise Infeasible(f"plan {p.label()}: dcp={p.dcp} exceeds the KV duplication "
                                 f"tp/kv_heads = {dup} (dcp <= tp/K and divides it)")
        ex = layer.mlp.experts
        if ex is not None:
            physical = ex.num_experts + p.redundant_experts
            if physical % p.ep:
                with_r = f" + {p.redundant_experts} redundant" if p.redundant_experts else ""
                raise Infeasible(f"plan {p.label()}: {ex.num_experts}{with_r} experts not "
                                 f"divisible by ep={p.ep} (redundant experts that make them "
                                 f"divide: {', '.join(map(str, redundant_choices(ex.num_experts, p.ep)))})")
            if ex.intermediate_size % p.moe_tp:
                raise Infeasible(f"plan {p.label()}: expert width {ex.intermediate_size} not "
                                 f"divisible by moe_tp={p.moe_tp}")
        for lin in layer.mlp.projections:
            if _tp_sharded(lin) and lin.out_features % p.tp and lin.in_features % p.tp:
                raise Infeasible(f"plan {p.label()}: {lin.name} width not divisible by tp={p.tp}")


# ---- sharding -----------------------------------------------------------------------------------
_REPLICATED = re.compile(r"(q_a_proj|kv_a_proj|(^|\.)wq_a$|(^|\.)wkv$|(^|\.)gate$|router|"
                         r"compressor|indexer|(^|\.)hc_)")


def _tp_sharded(lin: Linear) -> bool:
    """Projections vLLM replicates across TP: MLA down-projections, routers, small side paths."""
    return _sharded_name(lin.name)


@lru_cache(maxsize=4096)
def _sharded_name(name: str) -> bool:
    return not _REPLICATED.search(name)


def linear_shard(lin: Linear, plan: ParallelPlan) -> int:
    return plan.tp if _tp_sharded(lin) else 1


def kv_shard(att: Attention, plan: ParallelPlan) -> int:
    """How many ways one sequence's KV of this layer is split inside its TP group.

    GQA: min(tp, K) x dcp; MLA family: dcp (fully duplicated under plain TP); linear: tp.
    """
    if att.kind == "linear":
        return plan.tp
    kv = kv_heads_effective(att)
    return min(plan.tp, kv) * plan.dcp


def index_key_shard(plan: ParallelPlan) -> int:
    """How many ways one sequence's index keys are split inside its TP group. An indexer keeps
    one key per cached unit, shared by all its heads (MSA's index-K cache is [slots, 1,
    sparse_index_dim] in TensorRT-LLM's MiniMaxM3KVCacheManagerV2; DSA / CSA keep one per
    latent entry), so every TP rank stores the whole key, as MLA's latent: only DCP splits it."""
    return plan.dcp


def decode_attention_split(att: Attention, plan: ParallelPlan) -> tuple[int, int]:
    """(head shards, context shards) of one layer's decode attention on one GPU. DCP gathers
    its group's queries, so each rank runs tp/dcp of the heads over 1/dcp of the cached
    entries (and PCP's 1/pcp); a linear layer's recurrent state has no sequence axis to split:
    DCP leaves it TP-sharded by heads, as it stores it (kv_shard)."""
    if att.kind == "linear":
        return plan.tp, 1
    return max(plan.tp // plan.dcp, 1), plan.dcp * plan.pcp


def kv_duplication(att: Attention, plan: ParallelPlan) -> float:
    """Copies of each KV entry inside one TP group (1 = no duplication)."""
    return plan.tp / kv_shard(att, plan) if att.kind != "linear" else 1.0


def weight_bytes_per_gpu(arch: Architecture, plan: ParallelPlan, with_mtp: bool = False) -> float:
    """Weights one GPU holds: dense parts / tp (replicated ones whole), experts (with their
    redundant copies) / (moe_tp*ep), vocabulary-parallel embedding and LM head / tp, layers / pp
    (first/last stage: the mean)."""
    sharded, replicated, experts, heads = _weight_classes(arch, with_mtp)
    if plan.redundant_experts:  # every MoE layer holds its redundant copies too
        logical = routed_experts(arch)
        experts *= (logical + plan.redundant_experts) / logical
    return ((sharded / plan.tp + replicated + experts / (plan.moe_tp * plan.ep)) / plan.pp
            + heads / plan.tp / plan.pp)


@lru_cache(maxsize=256)
def _weight_classes(arch: Architecture, with_mtp: bool) -> tuple[float, float, float, float]:
    """(TP-sharded, replicated, routed-expert, embedding + LM head) weight bytes of the
    architecture, summed once per architecture (plans only divide them)."""
    sharded = replicated = experts = 0.0
    for layer in arch.main_layers + (arch.mtp_layers if with_mtp else ()):
        for lin in layer.attention.projections + layer.mlp.projections:
            b = lin.params * dtype(lin.dtype).bytes
            if _tp_sharded(lin):
                sharded += b
            else:
                replicated += b
        ex = layer.mlp.experts
        if ex is not None:
            experts += ex.params * dtype(ex.dtype).bytes
    heads = arch.embedding.params * dtype(arch.embedding.dtype).bytes
    if not arch.tie_word_embeddings:
        heads += arch.lm_head.params * dtype(arch.lm_head.dtype).bytes
    return sharded, replicated, experts, heads


# ---- collectives --------------------------------------------------------------------------------
@dataclass(frozen=True)
class Collective:
    """One collective a GPU joins per step. `bytes` follows nccl-tests: the full buffer size
    (all-reduce: the tensor; all-gather: the gathered output; all-to-all: what one rank sends)."""

    name: str
    op: str  # all_reduce | all_gather | reduce_scatter | all_to_all | p2p
    bytes: np.ndarray
    gpus: int
    scope: str  # scale_up | scale_out
    count: int  # times per step (layers)
    algorithm: str | None = None  # model.perf.comm algorithm; None: NCCL / custom all-reduce
    skip_empty: bool = False  # not launched at all where it carries no bytes (else: latency)


def _domain(hw) -> int:
    return int(getattr(hw, "scale_up_domain_gpus", 8) or 8)


def tp_crosses_domain(plan: ParallelPlan, hw) -> bool:
    """Whether the plan's TP group spans more GPUs than one scale-up domain holds (its
    all-reduces then run over the scale-out network)."""
    return plan.tp > _domain(hw)


def scope_of(group_gpus: int, hw, inner: int = 1) -> str:
    """A group of `group_gpus` ranks laid out with stride `inner` stays inside one scale-up domain
    when its whole span fits."""
    return "scale_up" if group_gpus * inner <= _domain(hw) else "scale_out"


def layer_collectives(layer: Layer, count: int, plan: ParallelPlan, hw, hidden: int,
                      prefill_tokens, decode_seqs, dispatch_dtype: str = "fp8",
                      prefill_ranks=None, prefill_context=0.0,
                      prefill_seqs=0.0) -> list[Collective]:
    """Collectives of one layer (times `count` identical layers) for a step on one replica, as
    the busiest rank sees them.

    Token arguments are replica totals; decode tokens are spread over the dp ranks, prefill
    tokens over `prefill_ranks` of them (default: all, balanced); `prefill_seqs` prefilling
    sequences (replica total) reach `prefill_context` tokens each (what DCP gathers).
    """
    p = plan
    act = 2.0  # bf16 hidden states
    pre = np.asarray(prefill_tokens, float)
    dec = np.asarray(decode_seqs, float)
    pranks = p.dp if prefill_ranks is None else prefill_ranks
    pre_rank = pre / pranks  # prefill tokens on the busiest attention rank (before pcp)
    tok_rank = pre_rank / p.pcp + dec / p.dp  # tokens through one attention rank
    out: list[Collective] = []
    tp_scope = scope_of(p.tp, hw)
    has_experts = layer.mlp.experts is not None
    if p.tp > 1:
        size = tok_rank * hidden * act
        if p.sp:
            out += [Collective("tp_reduce_scatter", "reduce_scatter", size, p.tp, tp_scope,
                               2 * count),
                    Collective("tp_all_gather", "all_gather", size, p.tp, tp_scope, 2 * count)]
        else:
            # after o_proj, and after the MLP: dense, shared and routed experts share one
            # all-reduce (with dp = 1 every TP rank holds all tokens, so EP needs no all-to-all:
            # each rank runs its experts on them and the sum rides the same all-reduce)
            n_ar = 2
            out.append(Collective("tp_all_reduce", "all_reduce", size, p.tp, tp_scope,
                                  n_ar * count))
    if has_experts and p.ep > 1 and p.dp * p.pcp > 1:
        ex = layer.mlp.experts
        # tokens leave their rank once per top-k expert (DeepEP's logical bytes,
        # github.com/deepseek-ai/DeepEP README)
        per_rank = tok_rank
        a2a_scope = scope_of(p.ep, hw)
        disp = per_rank * ex.top_k * ex.hidden_size * dtype(dispatch_dtype).bytes
        comb = per_rank * ex.top_k * ex.hidden_size * act
        out += [Collective("ep_dispatch", "all_to_all", disp, p.ep, a2a_scope, count),
                Collective("ep_combine", "all_to_all", comb, p.ep, a2a_scope, count)]
    elif has_experts and p.moe_tp > 1 and p.dp > 1:
        # attention-DP with TP experts: gather tokens of all DP ranks, reduce-scatter back
        size = (pre + dec) * hidden * act
        sc = scope_of(p.moe_tp, hw)
        out += [Collective("moe_all_gather", "all_gather", size, p.moe_tp, sc, count),
                Collective("moe_reduce_scatter", "reduce_scatter", size, p.moe_tp, sc, count)]
    att = layer.attention
    if p.dcp > 1 and att.kind != "linear":
        q_bytes = dec / p.dp * att.num_heads * att.head_dim * act
        o_bytes = dec / p.dp * att.num_heads * (att.v_head_dim + 2) * act  # + LSE
        sc = scope_of(p.dcp, hw)
        # vLLM's DCP in one NVLink domain: queries gathered and partial outputs + LSE written
        # straight into the peers' symmetric-memory buffers (PRs #48897, #50484), not NCCL
        algo = "symm" if sc == "scale_up" else None
        out += [Collective("dcp_q_all_gather", "all_gather", q_bytes, p.dcp, sc, count, algo),
                Collective("dcp_out_merge", "reduce_scatter" if p.dcp == p.tp else "all_reduce",
                           o_bytes, p.dcp, sc, count, algo)]
        # a prefill chunk attends to its whole context: each rank gathers the sharded cached
        # KV of its sequences (vLLM's DCP prefill, VLLM_USE_DIRECT_DCP_KV_GATHER) and runs its
        # tp heads over all of it (none in a decode-only step); entries at 2 B per element, as
        # PCP's gather
        pseqs = np.asarray(prefill_seqs, float) / pranks
        ctx_bytes = np.where(pre > 0, np.maximum(pseqs, 1.0), 0.0) * np.asarray(
            prefill_context, float) * entry_elements(att) * 2.0
        out.append(Collective("dcp_kv_all_gather", "all_gather", ctx_bytes, p.dcp, sc, count,
                              skip_empty=True))
    if p.pcp > 1 and att.kind != "linear":
        kv_entry = entry_elements(att) * 2.0
        sc = scope_of(p.pcp, hw, inner=p.tp)
        out += [Collective("pcp_kv_all_gather", "all_gather", pre_rank * kv_entry, p.pcp, sc,
                           count),
                Collective("pcp_hidden_all_gather", "all_gather", pre_rank * hidden * act,
                           p.pcp, sc, count)]
    return out


def pipeline_collectives(plan: ParallelPlan, hw, hidden: int, prefill_tokens,
                         decode_seqs) -> list[Collective]:
    """PP send/recv of the hidden states at each of the pp-1 stage boundaries."""
    if plan.pp == 1:
        return []
    size = (np.asarray(prefill_tokens, float) + np.asarray(decode_seqs, float)) / plan.dp * hidden * 2
    sc = scope_of(plan.pp, hw, inner=plan.attention_gpus)
    return [Collective("pp_send_recv", "p2p", size, 2, sc, plan.pp - 1)]


# ---- enumeration --------------------------------------------------------------------------------
def _divisors(n: int) -> list[int]:
    return [d for d in range(1, n + 1) if n % d == 0]


def enumerate_plans(arch: Architecture, hw, gpus: int, phase: str = "both",
                    hbm_weight_bytes=None) -> list[ParallelPlan]:
    """Valid plans for one replica of exactly `gpus` GPUs whose weights fit (`hbm_weight_bytes`:
    plan -> the weight bytes per GPU it keeps in HBM; default all of them).

    phase: "prefill" adds PCP and DCP candidates (DCP without PCP: a prefill worker that keeps
    the sessions' prefixes sharded, as InferenceX's Kimi K3 recipe runs), "decode" adds DCP
    candidates, "both" neither. MoE models get both expert layouts (TP experts, and EP across
    the whole stage, with redundant experts where the experts do not divide by it).
    """
    plans: list[ParallelPlan] = []
    hbm = float(getattr(hw, "hbm_bytes", np.inf))
    for pp in _divisors(gpus):
        stage = gpus // pp
        for pcp in (_divisors(stage) if phase == "prefill" else [1]):
            for tp in _divisors(stage // pcp):
                dp = stage // pcp // tp
                layouts = [(stage, 1, 0)]
                if is_moe(arch) and stage > 1:
                    # EP over the whole stage, with the fewest redundant experts that make the
                    # physical experts divide (none where the logical ones already do)
                    layouts.append((1, stage, (-routed_experts(arch)) % stage))
                for moe_tp, ep, redundant in layouts:
                    dcps = _divisors(tp) if phase == "decode" or (
                        phase == "prefill" and pcp == 1) else [1]
                    for dcp in dcps:
                        plan = ParallelPlan(tp=tp, pp=pp, dp=dp, ep=ep, moe_tp=moe_tp, pcp=pcp,
                                            dcp=dcp, redundant_experts=redundant)
                        try:
                            validate_plan(arch, hw, plan)
                        except Infeasible:
                            continue
                        held = (weight_bytes_per_gpu(arch, plan) if hbm_weight_bytes is None
                                else hbm_weight_bytes(plan))
                        if held < 0.9 * hbm:
                            plans.append(plan)
    return sorted(set(plans), key=lambda q: (q.pp, -q.tp, q.dp, q.ep, q.pcp, q.dcp,
                                              q.redundant_experts))


# ---- small closed forms used by the search and the tests ---------------------------------------
def dcp_rank_of_token(token_index, dcp: int, interleave: int = 1):
    """DCP rank storing a token's KV: (i // interleave) mod dcp (vLLM interleaved layout)."""
    return (np.asarray(token_index) // interleave) % dcp


def pipeline_speedup(stages: int, microbatches) -> np.ndarray:
    """Throughput gain of `stages` pipeline stages over one when a request is cut into
    `microbatches` chunks: S*M / (M + S - 1) (fill and drain bubbles)."""
    m = np.asarray(microbatches, float)
    return stages * m / (m + stages - 1)


def dep_slowed_fraction(dp: int, prefill_probability) -> np.ndarray:
    """Fraction of DEP steps slowed by a prefill on at least one of `dp` ranks when each rank
    independently carries prefill with probability p and steps are aligned: 1 - (1-p)^dp."""
    return 1.0 - (1.0 - np.asarray(prefill_probability, float)) ** dp

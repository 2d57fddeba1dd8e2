"""`servecast cache TRACE...`: exact prefix-cache replay of hash_ids traces (AgentX JSON file or
folder, Mooncake JSONL) at a capacity, policy and routing; `servecast reload`: reload vs recompute
of a prefix from each KV tier."""

from __future__ import annotations

import math

import typer

from model.frontends.cli.limits import require_nvme
from model.frontends.cli.output import JSON, emit
from model.specs.defaults import GPU_MEMORY_UTILIZATION, MAX_NUM_BATCHED_TOKENS
from model.specs.errors import ServecastError

# the replay's work grows with the replicas (least-loaded routing scans each one per request)
MAX_REPLICAS = 1024
DEFAULT_CONTEXT_TOKENS = 131072  # memory --context: a 128K-token sequence unless the window is shorter
TRACES = typer.Argument(..., help="AgentX trace file(s)/folder(s) or a Mooncake JSONL")


def _capacity(value: float | None, name: str) -> float:
    if value is None:
        return math.inf
    if not value >= 0:
        raise ServecastError(f"--{name} must be >= 0 tokens, got {value}")
    return float(value)


def _checked_plan(arch, hw, plan):
    """`plan`, refused (one line) where the model's heads, experts or widths do not divide
    across it (its MoE grouping filled as vLLM fills it), as serve and plan refuse it."""
    from model.perf.parallel import normalize_plan, validate_plan  # loads sympy: on use

    validate_plan(arch, hw, normalize_plan(arch, plan))
    return plan


def cache_summary(traces: list[str], capacity_tokens: float | None = None, policy: str = "lru",
                  replicas: int = 1, routing: str = "sticky", host_tokens: float | None = None,
                  nvme_tokens: float | None = None, pool_tokens: float = 0.0,
                  interval_tokens: int = 0, seed: int = 0) -> dict:
    """The `servecast cache` JSON object."""
    from model.serve.cache_replay import replay, stream_for  # loads numba: only when it runs
    from model.serve.routing import route_replay

    if not 1 <= replicas <= MAX_REPLICAS:
        raise ServecastError(f"--replicas: {replicas}; allowed: 1..{MAX_REPLICAS:,}")
    if interval_tokens < 0:
        raise ServecastError(f"--interval-tokens must be >= 0 (0: prompt ends only), got "
                             f"{interval_tokens}")
    stream = stream_for(traces)
    cap = _capacity(capacity_tokens, "capacity-tokens")
    base = {"traces": traces, "sessions": len(stream.session_ids), "requests": stream.requests,
            "block_tokens": stream.block_tokens, "policy": policy,
            "capacity_tokens": None if math.isinf(cap) else cap}
    if not (pool_tokens >= 0 and math.isfinite(pool_tokens)):
        raise ServecastError(f"--pool-tokens must be >= 0 tokens (finite), got {pool_tokens}")
    if replicas > 1 or pool_tokens > 0:
        if host_tokens is not None or nvme_tokens is not None:
            raise ServecastError("--host-tokens / --nvme-tokens apply to one replica; with "
                                 "--replicas use --pool-tokens for the shared tier")
        res = route_replay(stream, replicas, routing, cap, pool_tokens, policy, interval_tokens,
                           seed)
        return {**base, "hit_rate": res.hit_rate, "hit_tokens": res.hit_tokens,
                "input_tokens": res.input_tokens, "replicas": replicas, "routing": routing,
                "pool_tokens": pool_tokens, "hit_tokens_by_tier": res.hit_tokens_by_tier,
                "imbalance": res.imbalance, "uncached_imbalance": res.uncached_imbalance,
                "replica_input_tokens": res.replica_input_tokens.tolist()}
    tiers = {"hbm": cap}
    if host_tokens is not None:
        tiers["host"] = _capacity(host_tokens, "host-tokens")
    if nvme_tokens is not None:
        tiers["nvme"] = _capacity(nvme_tokens, "nvme-tokens")
    res = replay(stream, tiers, policy, interval_tokens)
    return {**base, "hit_rate": res.hit_rate, "hit_tokens": res.hit_tokens,
            "input_tokens": res.input_tokens, "replicas": 1, "routing": routing,
            "hit_tokens_by_tier": res.hit_tokens_by_tier,
            "hit_rate_by_tier": res.hit_rate_by_tier}


def register(app: typer.Typer) -> None:
    app.command("cache")(cache_cmd)
    app.command("memory")(memory_cmd)
    app.command("reload")(reload_cmd)


def cache_cmd(
    traces: list[str] = TRACES,
    capacity_tokens: float = typer.Option(None, "--capacity-tokens",
                                          help="HBM prefix-cache capacity per replica, "
                                          "tokens (default: infinite)"),
    policy: str = typer.Option("lru", "--policy", help="lru | interval | second-hit"),
    replicas: int = typer.Option(1, "--replicas", help="replicas requests are routed over"),
    routing: str = typer.Option("sticky", "--routing",
                                help="sticky | random | least-loaded"),
    host_tokens: float = typer.Option(None, "--host-tokens",
                                      help="host-memory tier capacity, tokens"),
    nvme_tokens: float = typer.Option(None, "--nvme-tokens", help="NVMe tier capacity"),
    pool_tokens: float = typer.Option(0.0, "--pool-tokens",
                                      help="shared remote pool (Mooncake store), tokens"),
    interval_tokens: int = typer.Option(0, "--interval-tokens",
                                        help="interval policy: checkpoint every N tokens "
                                        "(0: prompt ends only)"),
    seed: int = typer.Option(0, "--seed", min=0, help="random routing seed"),
    as_json: bool = JSON,
) -> None:
    """Replay a trace through a prefix cache: hit_rate = cached input tokens / input tokens."""
    emit(cache_summary(traces, capacity_tokens, policy, replicas, routing, host_tokens,
                       nvme_tokens, pool_tokens, interval_tokens, seed), as_json)


def memory_cmd(
    arch: str = typer.Option(..., "--arch", help="architecture name, HF id or config path"),
    hardware: str = typer.Option(..., "--hardware", help="hardware name or alias"),
    context_tokens: int = typer.Option(None, "--context", min=1, help="tokens per sequence "
                                       "(default: 131,072 or the model's window if shorter)"),
    tp: int = 1, pp: int = 1, dp: int = 1, ep: int = 1, dcp: int = 1,
    kv_dtype: str = typer.Option(None, "--kv-dtype", help="KV cache dtype; the family's "
                                 "recipe when omitted"),
    precision: str = typer.Option(None, "--precision", help="served weight format (e.g. "
                                  "fp8, mxfp8); the family's recipe when omitted"),
    allocator: str = typer.Option("hybrid", "--allocator", help="hybrid | static"),
    max_num_batched_tokens: int = typer.Option(MAX_NUM_BATCHED_TOKENS, "--max-num-batched-tokens",
                                               min=1),
    gpu_memory_utilization: float = GPU_MEMORY_UTILIZATION,
    allow_beyond_window: bool = typer.Option(
        False, "--allow-beyond-window", help="size a context past the model's window "
        "(max_position_embeddings) and say so in the output"),
    as_json: bool = JSON,
) -> None:
    """HBM budget per GPU (weights, activations, reserve, KV pool), sequences that fit,
    and the tier capacities in tokens; weights and KV as the family's serving recipe has
    them (data/deployments/), as `plan` does, unless given."""
    from model.perf.memory import hbm_budget  # loads sympy: only when the command runs
    from model.perf.parallel import ParallelPlan
    from model.perf.tiers import tier_capacity_tokens
    from model.specs.architecture import load_architecture, within_window
    from model.specs.hardware import load_hardware
    from model.specs.precision import with_precision
    from model.specs.recipes import recipe_settings

    a, hw = load_architecture(arch), load_hardware(hardware)
    if context_tokens is None:
        context_tokens = min(DEFAULT_CONTEXT_TOKENS, a.max_context or DEFAULT_CONTEXT_TOKENS)
    beyond = within_window(a, context_tokens, "--context", allow_beyond_window)
    precision, kv_dtype, _ = recipe_settings(a.name, precision, kv_dtype, speculative=False,
                                             hw=hw)
    a = with_precision(a, precision)
    plan = _checked_plan(a, hw, ParallelPlan(tp=tp, pp=pp, dp=dp, ep=ep, dcp=dcp))
    budget = hbm_budget(a, hw, plan, kv_dtype=kv_dtype,
                        max_num_batched_tokens=max_num_batched_tokens, allocator=allocator,
                        gpu_memory_utilization=gpu_memory_utilization)
    emit({"arch": a.name, "hardware": hw.name, "plan": plan.label(),
          "precision": precision or a.weight_dtype,
          "kv_dtype": kv_dtype or a.default_kv_dtype, **budget.summary(),
          "context_tokens": context_tokens,
          "max_sequences": budget.max_sequences(context_tokens),
          "kv_capacity_tokens": budget.kv_capacity_tokens(context_tokens),
          "padding_fraction": budget.padding_fraction(context_tokens),
          "tier_capacity_tokens": tier_capacity_tokens(a, hw, plan, kv_dtype, budget),
          "assumptions": [beyond] if beyond else []},
         as_json)


def reload_cmd(
    arch: str = typer.Option(..., "--arch", help="architecture name, HF id or config path"),
    hardware: str = typer.Option(..., "--hardware", help="hardware name or alias"),
    tier: str = typer.Option("host", "--tier", help="host | nvme | remote"),
    tp: int = 1, pp: int = 1, dp: int = 1, ep: int = 1,
    mode: str = typer.Option("batched", "--mode", help="batched | solo recompute cost"),
    as_json: bool = JSON,
) -> None:
    """Reload a prefix's KV from a tier or recompute it: times by context, break-even."""
    from model.perf.parallel import ParallelPlan  # loads sympy: only when the command runs
    from model.perf.tiers import break_even
    from model.specs.architecture import load_architecture
    from model.specs.hardware import load_hardware

    a, hw = load_architecture(arch), load_hardware(hardware)
    require_nvme(hw, (tier,), "--tier")
    plan = _checked_plan(a, hw, ParallelPlan(tp=tp, pp=pp, dp=dp, ep=ep))
    res = break_even(a, hw, plan, tier, mode=mode)
    emit({"arch": arch, "plan": plan.label(), "mode": mode, **res.summary(),
          "contexts_tokens": res.contexts_tokens.tolist(), "load_s": res.load_s.tolist(),
          "recompute_s": res.recompute_s.tolist()}, as_json)

"""What a plan is asked, resolved once and checked: the specs, the serving format (the family's
deployment recipe fills precision, KV dtype and speculative decoding left unset;
data/deployments/, model.specs.recipes), the cache, the workload's traffic moments for the
screening tier and the serving setup of the full tier. Bad input is one ServecastError line."""

from __future__ import annotations

from dataclasses import dataclass

import numpy as np

from model.plan.evaluate import ServingSetup, serving_setup
from model.plan.plan_models import load_specs, served_kv_bytes_per_token
from model.plan.search_cache import CacheSetup
from model.plan.traffic import Traffic, traffic_for
from model.serve.cache_replay import check_policy
from model.serve.deployment import CacheChoice
from model.serve.policy import EnginePolicy, frontend_rate_s_per_token
from model.serve.request_mix import request_mix_for
from model.specs.defaults import ATTENTION_BACKEND, DRAFT_ATTENTION_BACKEND, MAX_NUM_BATCHED_TOKENS
from model.specs.errors import ServecastError
from model.specs.precision import with_precision
from model.specs.recipes import SPEC_OFF, recipe_settings

SPEC_METHODS = ("mtp", "eagle3", "dspark")
CACHE_TIERS = ("hbm", "host", "nvme")


@dataclass(frozen=True)
class PlanInputs:
    arch: object
    hardware: object
    prefill_hardware: object  # the decode chip unless disaggregated prefill runs elsewhere
    workload: object
    precision: str | None
    kv_dtype: str | None
    spec: tuple  # (draft tokens, acceptance length, method)
    recipe: bool  # the family's recipe filled the unset serving settings
    cache: CacheSetup
    finite_cache: bool  # the hit rate answers to each candidate's capacity
    hit_rate: float | None  # a fixed hit rate instead
    traffic: Traffic
    kv_bytes_per_token: float  # of the architecture as served
    max_num_batched_tokens: int
    setup: ServingSetup  # the full tier's
    beyond_window: str | None = None  # the assumption to report when requests pass the window
    cpu_offload_gib: float = 0.0  # weights per GPU each engine keeps in host memory
    frontend: str | None = None  # the request front end (Deployment.frontend)
    attention_backend: str = ATTENTION_BACKEND  # the engines' attention kernels (EnginePolicy)
    draft_attention_backend: str = DRAFT_ATTENTION_BACKEND  # their drafters' (EnginePolicy)

    @property
    def cache_inputs(self):
        """The screening's finite-cache inputs (None: the workload's own hit rate)."""
        if not self.finite_cache or self.hit_rate is not None:
            return None
        return (with_precision(self.arch, self.precision), self.kv_dtype, self.workload,
                self.cache)


@dataclass(frozen=True)
class ServingChoices:
    """The serving format and cache a deployment is served with, before the recipe fills the
    unset ones (`resolve`)."""

    precision: str | None = None
    kv_dtype: str | None = None
    spec_tokens: int | None = None
    acceptance_length: float | None = None
    spec_method: str | None = None
    recipe: bool = True
    cache_policy: str = "lru"
    cache_tiers: tuple[str, ...] = ("hbm", "host")
    finite_cache: bool = True
    hit_rate: float | None = None
    prefetch_reload: bool = False
    allow_beyond_window: bool = False  # serve requests past the model's window, and say so

    def resolve(self, arch, hw) -> tuple[str | None, str | None, tuple]:
        """(precision, KV dtype, speculative setting), the recipe's where unset."""
        precision, kv_dtype = self.precision, self.kv_dtype
        spec = (self.spec_tokens, self.acceptance_length, self.spec_method)
        if self.recipe:
            precision, kv_dtype, recipe_spec = recipe_settings(arch.name, precision, kv_dtype,
                                                               hw=hw)
            if spec[0] is None and recipe_spec is not None:
                spec = recipe_spec
        return precision, kv_dtype, spec_setting(*spec)

    def cache_choice(self) -> CacheChoice:
        cache = CacheSetup(self.cache_policy, tuple(self.cache_tiers))
        check_cache(cache)
        if self.hit_rate is not None:
            return CacheChoice(hit_rate=float(self.hit_rate))
        if not self.finite_cache:
            return CacheChoice(infinite=True)
        return CacheChoice(cache.policy, cache.tiers, prefetch_reload=self.prefetch_reload)


def setup_for(arch, hardware, workload, choices: ServingChoices, prefill_hardware=None,
              seed: int = 0) -> ServingSetup:
    """The full tier's serving setup (what `servecast serve --deployment` serves with)."""
    a, hw, w = load_specs(arch, hardware, workload)
    workload_within_window(a, w, choices.allow_beyond_window)
    phw = hw if prefill_hardware is None else load_specs(a, prefill_hardware)[1]
    precision, kv_dtype, spec = choices.resolve(a, hw)
    return serving_setup(a, hw, phw, w, precision, kv_dtype, spec, choices.cache_choice(), seed)


def resolve_inputs(arch, hardware, workload, choices: ServingChoices = ServingChoices(),
                   prefill_hardware=None,
                   max_num_batched_tokens: int = MAX_NUM_BATCHED_TOKENS,
                   traffic: Traffic | None = None, cpu_offload_gib: float = 0.0,
                   frontend: str | None = None,
                   attention_backend: str = ATTENTION_BACKEND,
                   draft_attention_backend: str = DRAFT_ATTENTION_BACKEND) -> PlanInputs:
    """A plan's inputs: the serving setup plus the screening's traffic and cache inputs;
    `cpu_offload_gib`: weights per GPU each engine keeps in host memory (vLLM --cpu-offload-gb,
    in GiB); `frontend`: the request front end (model.specs.defaults.FRONTENDS);
    `attention_backend` / `draft_attention_backend`: the engines' and their drafters' attention
    kernels (model.specs.defaults.ATTENTION_BACKENDS, DRAFT_ATTENTION_BACKENDS)."""
    if int(max_num_batched_tokens) < 1:
        raise ServecastError(f"max_num_batched_tokens={max_num_batched_tokens}: must be >= 1")
    engine = EnginePolicy(cpu_offload_gib=cpu_offload_gib,
                          attention_backend=attention_backend,
                          draft_attention_backend=draft_attention_backend)  # validated
    frontend_rate_s_per_token(frontend)  # validated
    setup = setup_for(arch, hardware, workload, choices, prefill_hardware)
    a, w = setup.arch, setup.workload
    return PlanInputs(a, setup.hardware, setup.prefill_hardware, w, setup.precision,
                      setup.kv_dtype, setup.spec, choices.recipe,
                      CacheSetup(choices.cache_policy, tuple(choices.cache_tiers)),
                      choices.finite_cache, choices.hit_rate,
                      traffic or traffic_for(w, choices.hit_rate),
                      served_kv_bytes_per_token(a, setup.precision, setup.kv_dtype),
                      int(max_num_batched_tokens), setup,
                      workload_within_window(a, w, choices.allow_beyond_window),
                      float(engine.cpu_offload_gib), frontend, engine.attention_backend,
                      engine.draft_attention_backend)


def workload_within_window(arch, workload, allow_beyond: bool = False) -> str | None:
    """Refuse a workload whose requests (context plus output, in the sample the serving model
    integrates over) reach past the model's window, since an engine rejects them; with
    `allow_beyond` return the assumption to report (None when every request fits)."""
    window = arch.max_context
    if not window:
        return None
    mix = request_mix_for(workload)
    tokens = np.asarray(mix.context_tokens) + np.asarray(mix.output_tokens)
    beyond = float(np.mean(tokens > window))
    if beyond == 0.0:
        return None
    what = (f"workload {workload.name}: {beyond:.1%} of its requests (context + output, up to "
            f"{tokens.max():,.0f} tokens) exceed {arch.name}'s window of {window:,} tokens "
            f"(max_position_embeddings)")
    if not allow_beyond:
        raise ServecastError(f"{what}; allowed: a workload within the window, or "
                             f"--allow-beyond-window to extrapolate")
    return f"{what}: extrapolated past what the model was built for"


def spec_setting(tokens: int | None, acceptance_length: float | None,
                 method: str | None) -> tuple[int, float, str]:
    """(draft tokens, acceptance length, method), checked: one error line on bad input."""
    k = int(tokens or 0)
    al = float(acceptance_length or 0.0)
    m = method or SPEC_OFF[2]
    if k < 0 or m not in SPEC_METHODS:
        raise ServecastError(f"speculative decoding: spec_tokens {k} must be >= 0 and method "
                             f"{m!r} one of {', '.join(SPEC_METHODS)}")
    if k and not 1.0 <= al <= 1.0 + k:
        raise ServecastError(f"speculative decoding: acceptance_length {al:g} must be in "
                             f"[1, 1 + spec_tokens = {1 + k}]")
    return (k, al if k else 0.0, m)


def check_cache(cache: CacheSetup) -> None:
    check_policy(cache.policy)
    if not cache.tiers or cache.tiers[0] != "hbm" or any(t not in CACHE_TIERS
                                                         for t in cache.tiers):
        raise ServecastError(f"cache tiers {','.join(cache.tiers) or '(none)'}: start with hbm, "
                             f"then any of {', '.join(CACHE_TIERS[1:])}")

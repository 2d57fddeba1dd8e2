"""One deployment served by the full tier: the function `serve --deployment`, `plan --deployment`
and the measured-run scoreboard share (`evaluate_deployment`), the serving setup it keys on, and
the deployment a parsed label describes (`labelled_deployment`). The search around it
(shortlist, the SLO's edge, the Pareto points) is model.plan.full_tier; this module stays free
of pandas, so `serve` starts without it."""

from __future__ import annotations

import functools
from dataclasses import dataclass, field, replace

from model.perf.parallel import normalize_plan, tp_crosses_domain, validate_plan
from model.perf.step import build_step_model
from model.plan.deployment import Deployment, DeploymentShape, PhaseConfig
from model.plan.traffic import Keyed
from model.serve.deployment import CacheChoice, DeploymentServing, serve_deployment
from model.serve.policy import EnginePolicy, frontend_rate_s_per_token
from model.serve.pools import Workers
from model.specs.precision import with_precision
from model.specs.recipes import SPEC_OFF
from model.specs.workload import ClosedLoop, Load


@dataclass(frozen=True)
class ServingSetup:
    """What the full tier serves a deployment with: the architecture and chips, the serving
    format (weights, KV dtype, speculative decoding), the workload and the cache. Compared and
    hashed by `key` (names and settings), so evaluations memoize on it."""

    arch: object = field(compare=False)
    hardware: object = field(compare=False)  # decode workers' and replicas' chip
    prefill_hardware: object = field(compare=False)
    workload: object = field(compare=False)
    precision: str | None = field(default=None, compare=False)
    kv_dtype: str | None = field(default=None, compare=False)
    spec: tuple = field(default=SPEC_OFF, compare=False)
    cache: CacheChoice = field(default=CacheChoice(), compare=False)
    seed: int = field(default=0, compare=False)
    key: tuple = ()


def serving_setup(arch, hardware, prefill_hardware, workload, precision, kv_dtype, spec,
                  cache: CacheChoice, seed: int = 0) -> ServingSetup:
    key = (Keyed.arch(arch).key, hardware.name, prefill_hardware.name,
           Keyed.workload(workload).key, precision, kv_dtype, tuple(spec), cache, seed)
    return ServingSetup(arch, hardware, prefill_hardware, workload, precision, kv_dtype,
                        tuple(spec), cache, seed, key)


def evaluate_deployment(setup: ServingSetup, deployment: Deployment,
                        load: Load | None = None, *, e2e: bool = True) -> DeploymentServing:
    """The full tier for `deployment` (its plans, workers and engine settings) under `load`
    (default: its concurrency as a closed loop of sessions); `e2e=False` leaves out the E2E
    normalized interactivity (model.serve.engine.serve)."""
    return _evaluate(setup, _bare(deployment), load or ClosedLoop(int(deployment.concurrency)),
                     e2e)


def _bare(deployment: Deployment) -> Deployment:
    """The deployment without its serving format and extras (not part of its identity)."""
    return replace(deployment, serving=None, extras={})


@functools.lru_cache(maxsize=1024)
def _evaluate(setup: ServingSetup, deployment: Deployment, load: Load,
              e2e: bool) -> DeploymentServing:
    # the deployment's engines behind their API server, which renders and tokenizes each
    # request's whole prompt before an engine sees it
    policy = EnginePolicy(deployment.max_num_batched_tokens, deployment.max_num_seqs,
                          deployment.long_prefill_token_threshold,
                          deployment.prefill_schedule_interval, deployment.kernel_launch,
                          frontend_rate_s_per_token(deployment.frontend),
                          deployment.cpu_offload_gib, deployment.attention_backend,
                          deployment.draft_attention_backend)
    if deployment.mode == "aggregated":
        replica = Workers(worker_step_model(setup, setup.hardware, deployment.replica, True,
                                            policy), deployment.replica.instances)
        return serve_deployment(setup.workload, policy, load, replicas=replica,
                                cache=setup.cache, seed=setup.seed, e2e=e2e)
    prefill = Workers(worker_step_model(setup, setup.prefill_hardware, deployment.prefill, False,
                                        policy), deployment.prefill.instances)
    decode = Workers(worker_step_model(setup, setup.hardware, deployment.decode, True, policy),
                     deployment.decode.instances)
    link = min(float(setup.prefill_hardware.scale_out_bandwidth_bytes_per_s),
               float(setup.hardware.scale_out_bandwidth_bytes_per_s))
    return serve_deployment(setup.workload, policy, load, prefill=prefill, decode=decode,
                            link_bytes_per_s=link, cache=setup.cache, seed=setup.seed, e2e=e2e)


def worker_step_model(setup: ServingSetup, hw, phase: PhaseConfig, decodes: bool,
                      policy: EnginePolicy | None = None):
    """The worker's step model as the screening built it (prefill-only workers draft nothing),
    as the engine `policy` runs it: its KV pool net of the activations of its batched tokens
    per step, its kernels launched as it says (model.specs.defaults.KERNEL_LAUNCH_MODES), the
    weights it keeps in host memory (model.perf.host_weights). Its plan was
    validated where the deployment was made: the search places no TP group across scale-up
    domains, a labelled deployment may (`labelled_deployment`)."""
    policy = policy or EnginePolicy()
    spec = setup.spec if decodes else SPEC_OFF
    return build_step_model(setup.arch, hw, phase.plan, precision=setup.precision,
                            cross_domain_tp=tp_crosses_domain(phase.plan, hw),
                            kv_dtype=setup.kv_dtype, spec_tokens=spec[0],
                            acceptance_length=spec[1], spec_method=spec[2],
                            max_num_batched_tokens=policy.max_num_batched_tokens,
                            kernel_launch=policy.kernel_launch,
                            cpu_offload_gib=policy.cpu_offload_gib,
                            attention_backend=policy.attention_backend,
                            draft_attention_backend=policy.draft_attention_backend)


def labelled_deployment(shape: DeploymentShape, setup: ServingSetup, concurrency: int,
                        policy: EnginePolicy, frontend: str | None = None) -> Deployment:
    """The deployment a parsed label describes, served with `setup` and `policy`: its plans
    normalized for the architecture as served and validated (a plan that does not fit is one
    error line), as the screening writes them. A label may place a TP group across scale-up
    domains, as measured deployments do (TP16 over two 8-GPU H200 nodes); its all-reduces then
    run over the scale-out network. `frontend`: the request front end (Deployment.frontend)."""
    sized = with_precision(setup.arch, setup.precision)

    def phase(hw, plan, count: int, decodes: bool) -> PhaseConfig:
        plan = normalize_plan(sized, plan)
        validate_plan(sized, hw, plan, cross_domain_tp=True)
        return PhaseConfig(hw.name, worker_step_model(setup, hw, PhaseConfig(hw.name, plan, count),
                                          decodes, policy).plan, count)

    common = {"arch": setup.arch.name, "concurrency": int(concurrency),
              "max_num_batched_tokens": policy.max_num_batched_tokens,
              "max_num_seqs": policy.max_num_seqs,
              "long_prefill_token_threshold": policy.long_prefill_token_threshold,
              "prefill_schedule_interval": policy.prefill_schedule_interval,
              "kernel_launch": policy.kernel_launch, "cpu_offload_gib": policy.cpu_offload_gib,
              "attention_backend": policy.attention_backend,
              "draft_attention_backend": policy.draft_attention_backend,
              "frontend": frontend}
    if shape.mode == "aggregated":
        return Deployment(mode="aggregated", replica=phase(setup.hardware, shape.replica,
                                                           shape.replicas or 1, True), **common)
    return Deployment(mode="disaggregated",
                      prefill=phase(setup.prefill_hardware, shape.prefill,
                                    shape.prefill_workers, False),
                      decode=phase(setup.hardware, shape.decode, shape.decode_workers, True),
                      **common)

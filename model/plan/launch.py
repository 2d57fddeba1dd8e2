"""Launch commands that realize a deployment: `vllm serve` and SGLang `launch_server` lines.

vLLM flags (engine args, vLLM >= 0.11 docs): `--tensor-parallel-size`, `--pipeline-parallel-size`,
`--data-parallel-size`, `--enable-expert-parallel` (experts over EP = TP x DP), DCP
`--decode-context-parallel-size`, PCP `--prefill-context-parallel-size`, chunking
`--max-num-batched-tokens`, `--max-num-seqs`, `--long-prefill-token-threshold`, the AgentX
`--prefill-schedule-interval`, and P/D via `--kv-transfer-config` (NixlConnector / MooncakeConnector,
roles kv_producer / kv_consumer). SGLang: `--tp-size`, `--dp-size --enable-dp-attention`,
`--ep-size`, `--pp-size`, `--chunked-prefill-size`, `--disaggregation-mode prefill|decode` with
`--disaggregation-transfer-backend`. The serving format (`ServingFormat`, from the family's
recipe in data/deployments/) adds the checkpoint, `--kv-cache-dtype`, the index-key cache and
`--speculative-config` (SGLang: `--kv-cache-dtype fp8_e4m3`, `--speculative-algorithm`). Flags a
backend lacks are reported as notes, never invented.
"""

from __future__ import annotations

import json
import shlex

from model.plan.deployment import Deployment, PhaseConfig, ServingFormat
from model.specs.architecture import load_architecture
from model.specs.errors import ServecastError


def _model_id(arch: str) -> str:
    """The checkpoint the launch line names: the architecture's HF id (data/architectures/),
    else the name as given (an ad-hoc config path)."""
    try:
        return load_architecture(arch).hf_id or arch
    except ServecastError:
        return arch


def _format(dep: Deployment) -> ServingFormat:
    return dep.serving or ServingFormat()


def _checkpoint(dep: Deployment) -> str:
    return _format(dep).checkpoint or _model_id(dep.arch)


def _join(parts: list[str]) -> str:
    return " ".join(shlex.quote(p) if i else p for i, p in enumerate(parts))


def vllm_parallel_flags(phase: PhaseConfig) -> list[str]:
    p = phase.plan
    flags = ["--tensor-parallel-size", str(p.tp)]
    if p.pp > 1:
        flags += ["--pipeline-parallel-size", str(p.pp)]
    if p.dp > 1:
        flags += ["--data-parallel-size", str(p.dp)]
    if p.ep > 1:
        flags += ["--enable-expert-parallel"]
    if p.redundant_experts:  # vLLM docs/serving/expert_parallel_deployment.md (EPLB)
        flags += ["--enable-eplb", "--eplb-config",
                  json.dumps({"num_redundant_experts": p.redundant_experts})]
    if p.dcp > 1:
        flags += ["--decode-context-parallel-size", str(p.dcp)]
    if p.pcp > 1:
        flags += ["--prefill-context-parallel-size", str(p.pcp)]
    if p.sp:
        flags += ["--compilation-config", json.dumps({"pass_config": {"enable_sp": True}})]
    return flags


def _vllm_engine_flags(dep: Deployment, role: str) -> list[str]:
    flags = ["--max-num-batched-tokens", str(dep.max_num_batched_tokens),
             "--max-num-seqs", str(dep.max_num_seqs), "--enable-prefix-caching",
             *_format(dep).vllm_flags()]
    if role != "decode" and dep.long_prefill_token_threshold > 0:
        flags += ["--long-prefill-token-threshold", str(dep.long_prefill_token_threshold)]
    if role == "mixed" and dep.prefill_schedule_interval > 1:
        flags += ["--prefill-schedule-interval", str(dep.prefill_schedule_interval)]
    if dep.cpu_offload_gib > 0:  # GiB per GPU, as vLLM's flag counts them
        flags += ["--cpu-offload-gb", f"{dep.cpu_offload_gib:g}"]
    if dep.attention_backend == "triton":
        flags += ["--attention-backend", "TRITON_ATTN"]
    return flags


def vllm_commands(dep: Deployment) -> list[str]:
    model = _checkpoint(dep)
    note = _format(dep).weights_note
    out = [f"# note: {note}"] if note else []
    if dep.draft_attention_backend != "same":
        out.append(f"# note: the drafter's attention is {dep.draft_attention_backend} (set "
                   "the speculative config's attention_backend): not expressed")
    if dep.mode == "aggregated":
        r = dep.replica
        cmd = ["vllm", "serve", model, *vllm_parallel_flags(r), *_vllm_engine_flags(dep, "mixed")]
        return out + [f"# {r.instances} replica(s) on {r.hardware}, {r.plan.gpus} GPU(s) each; "
                      "route sessions stickily (same session -> same replica)", _join(cmd)]
    for role, phase, kv_role in (("prefill", dep.prefill, "kv_producer"),
                                 ("decode", dep.decode, "kv_consumer")):
        cfg = json.dumps({"kv_connector": dep.kv_connector, "kv_role": kv_role},
                         separators=(",", ":"))
        cmd = ["vllm", "serve", model, *vllm_parallel_flags(phase),
               *_vllm_engine_flags(dep, role), "--kv-transfer-config", cfg]
        out.append(f"# {role}: {phase.instances} instance(s) on {phase.hardware}, "
                   f"{phase.plan.gpus} GPU(s) each")
        out.append(_join(cmd))
    out.append("# put a P/D proxy (vLLM disagg proxy / llm-d router) in front, sticky by session")
    return out


def sglang_flags(phase: PhaseConfig) -> tuple[list[str], list[str]]:
    p = phase.plan
    flags = ["--tp-size", str(p.tp * p.dp)]  # SGLang's tp spans the attention-DP ranks too
    notes = []
    if p.dp > 1:
        flags += ["--dp-size", str(p.dp), "--enable-dp-attention"]
    if p.ep > 1:
        flags += ["--ep-size", str(p.ep)]
    if p.redundant_experts:  # SGLang server arguments (EPLB)
        flags += ["--enable-eplb", "--ep-num-redundant-experts", str(p.redundant_experts)]
    if p.pp > 1:
        flags += ["--pp-size", str(p.pp)]
    if p.dcp > 1:
        notes.append(f"SGLang has no decode context parallel flag; dcp={p.dcp} not expressed")
    if p.pcp > 1:
        notes.append(f"prefill context parallel pcp={p.pcp}: SGLang's context-parallel prefill "
                     "is model-specific; not expressed")
    return flags, notes


def sglang_commands(dep: Deployment) -> list[str]:
    model = _checkpoint(dep)
    base = ["python", "-m", "sglang.launch_server", "--model-path", model]
    fmt_flags, fmt_notes = _format(dep).sglang_flags()
    chunk = ["--chunked-prefill-size", str(dep.long_prefill_token_threshold
                                           or dep.max_num_batched_tokens),
             "--max-running-requests", str(dep.max_num_seqs)]
    phases = ([("mixed", dep.replica)] if dep.mode == "aggregated"
              else [("prefill", dep.prefill), ("decode", dep.decode)])
    out = []
    for role, phase in phases:
        flags, notes = sglang_flags(phase)
        extra = [] if role == "mixed" else ["--disaggregation-mode", role,
                                            "--disaggregation-transfer-backend", "mooncake"]
        if dep.cpu_offload_gib > 0:
            notes = notes + [f"weights in host memory ({dep.cpu_offload_gib:g} GiB per GPU, "
                             "vLLM's --cpu-offload-gb): not expressed"]
        if dep.attention_backend == "triton":
            notes = notes + ["vLLM's Triton attention (--attention-backend TRITON_ATTN), as "
                             "modelled: not expressed; SGLang runs its own kernels"]
        out += [f"# note: {n}" for n in notes + fmt_notes]
        out.append(f"# {role}: {phase.instances} instance(s) on {phase.hardware}")
        out.append(_join([*base, *flags, *fmt_flags, *chunk, *extra]))
    return out


def launch_commands(dep: Deployment) -> dict[str, list[str]]:
    """Both engines' command lines for `dep` (comments start with '#')."""
    return {"vllm": vllm_commands(dep), "sglang": sglang_commands(dep)}

"""What a deployment is: worker kinds (`PhaseConfig`), the whole deployment (`Deployment`:
aggregated replicas or x prefill + y decode workers, engine settings, client sessions), what the
engine serves (`ServingFormat`: checkpoint, cache dtypes, speculative decoding), and the
deployment labels users write (`parse_deployment_label`).

Labels: a replica plan as `model.perf.parallel.ParallelPlan.label` writes it (`dp8-ep8`, `tp4`,
`tp8-moetp8-dcp8`), optionally with its replica count (`2x[tp4]`), or a disaggregated deployment
`1P[dp4-ep4]1D[dp8-ep8]` (x prefill workers of one plan, y decode workers of another).
"""

from __future__ import annotations

import json
import re
from dataclasses import dataclass, field

from model.perf.parallel import ParallelPlan
from model.specs.defaults import (
    ATTENTION_BACKEND,
    DRAFT_ATTENTION_BACKEND,
    FRONTENDS,
    KERNEL_LAUNCH,
    MAX_NUM_BATCHED_TOKENS,
    MAX_NUM_SEQS,
    MODES,
)
from model.specs.errors import ServecastError


@dataclass(frozen=True)
class PhaseConfig:
    """One kind of worker: a chip, a parallel plan and how many instances run it."""

    hardware: str
    plan: ParallelPlan
    instances: int = 1

    @property
    def gpus(self) -> int:
        return self.plan.gpus * self.instances

    def as_dict(self) -> dict[str, object]:
        p = self.plan
        return {"hardware": self.hardware, "plan": p.label(), "instances": self.instances,
                "gpus": self.gpus, "tp": p.tp, "pp": p.pp, "dp": p.dp, "ep": p.ep,
                "moe_tp": p.moe_tp, "pcp": p.pcp, "dcp": p.dcp, "sp": p.sp}


@dataclass(frozen=True)
class ServingFormat:
    """What the engine serves: checkpoint (None: the architecture's own), KV-cache and index-key
    cache dtypes, speculative decoding (method, draft tokens, external draft checkpoint)."""

    checkpoint: str | None = None
    kv_dtype: str | None = None
    indexer_kv_dtype: str | None = None
    spec_method: str = "none"
    spec_tokens: int = 0
    draft_model: str | None = None
    extra_vllm: tuple[str, ...] = ()  # the recipe's further flags (data/deployments/)
    # weights the engine quantizes as it loads a checkpoint of another format (--quantization),
    # or why no flag can give the format the plan assumed
    quantization: str | None = None
    weights_note: str | None = None

    def vllm_flags(self) -> list[str]:
        flags = list(self.extra_vllm)
        if self.quantization:
            flags += ["--quantization", self.quantization]
        if self.kv_dtype and self.kv_dtype not in ("bf16", "auto"):
            flags += ["--kv-cache-dtype", self.kv_dtype]
        if self.indexer_kv_dtype:  # InferenceX MiniMax M3 B300 recipe: attention-config
            flags += ["--attention-config",
                      json.dumps({"indexer_kv_dtype": self.indexer_kv_dtype},
                                 separators=(",", ":"))]
        if self.spec_tokens:
            cfg = {"method": self.spec_method, "num_speculative_tokens": self.spec_tokens}
            if self.draft_model:
                cfg["model"] = self.draft_model
            flags += ["--speculative-config", json.dumps(cfg, separators=(",", ":"))]
        return flags

    def sglang_flags(self) -> tuple[list[str], list[str]]:
        flags, notes = [], []
        if self.quantization:
            flags += ["--quantization", self.quantization]
        if self.weights_note:
            notes.append(self.weights_note)
        if self.kv_dtype == "fp8":
            flags += ["--kv-cache-dtype", "fp8_e4m3"]
        if self.spec_tokens:
            algo = {"eagle3": "EAGLE3", "mtp": "NEXTN"}.get(self.spec_method)
            if algo is None:
                notes.append(f"speculative method {self.spec_method} has no SGLang equivalent "
                             "here; not expressed")
            else:
                flags += ["--speculative-algorithm", algo, "--speculative-num-steps",
                          str(self.spec_tokens), "--speculative-eagle-topk", "1",
                          "--speculative-num-draft-tokens", str(self.spec_tokens + 1)]
                if self.draft_model:
                    flags += ["--speculative-draft-model-path", self.draft_model]
        if self.indexer_kv_dtype:
            notes.append(f"index-key cache {self.indexer_kv_dtype}: no SGLang flag; not "
                         "expressed")
        return flags, notes


@dataclass(frozen=True)
class Deployment:
    """A complete serving deployment: aggregated replicas, or x prefill + y decode workers."""

    mode: str  # "aggregated" | "disaggregated"
    arch: str
    concurrency: int  # client lanes (closed-loop sessions) across the whole deployment
    replica: PhaseConfig | None = None  # aggregated
    prefill: PhaseConfig | None = None  # disaggregated
    decode: PhaseConfig | None = None
    max_num_batched_tokens: int = MAX_NUM_BATCHED_TOKENS
    max_num_seqs: int = MAX_NUM_SEQS
    long_prefill_token_threshold: int = 0  # 0 = off (vLLM)
    prefill_schedule_interval: int = 1
    kernel_launch: str = KERNEL_LAUNCH  # cuda-graphs | eager | eager-blocking (EnginePolicy)
    cpu_offload_gib: float = 0.0  # weights per GPU in host memory (EnginePolicy)
    attention_backend: str = ATTENTION_BACKEND  # default | triton (EnginePolicy)
    draft_attention_backend: str = DRAFT_ATTENTION_BACKEND  # same | default | triton
    # the request front end (model.specs.defaults.FRONTENDS); None: its tokenization alone
    frontend: str | None = None
    kv_connector: str = "NixlConnector"
    # checkpoint, KV dtype, speculative decoding (None: the architecture's own, defaults)
    serving: ServingFormat | None = field(default=None, compare=False, hash=False)
    extras: dict[str, object] = field(default_factory=dict, compare=False, hash=False)

    def __post_init__(self) -> None:
        if self.mode not in MODES:
            raise ServecastError(f"Deployment: mode {self.mode!r}: allowed {', '.join(MODES)}")
        if self.mode == "aggregated" and self.replica is None:
            raise ServecastError("Deployment: aggregated mode needs `replica`")
        if self.mode == "disaggregated" and (self.prefill is None or self.decode is None):
            raise ServecastError("Deployment: disaggregated mode needs `prefill` and `decode`")
        if self.frontend is not None and self.frontend not in FRONTENDS:
            raise ServecastError(f"Deployment: frontend {self.frontend!r}: allowed "
                                 f"{', '.join(FRONTENDS)}")

    @property
    def gpus(self) -> int:
        if self.mode == "aggregated":
            return self.replica.gpus
        return self.prefill.gpus + self.decode.gpus

    def shape_label(self) -> str:
        """The label `parse_deployment_label` reads back: `2x[tp4]`, `1P[dp4-ep4]1D[dp8-ep8]`."""
        if self.mode == "aggregated":
            return f"{self.replica.instances}x[{self.replica.plan.label()}]"
        return (f"{self.prefill.instances}P[{self.prefill.plan.label()}]"
                f"{self.decode.instances}D[{self.decode.plan.label()}]")

    def label(self) -> str:
        mode = "agg" if self.mode == "aggregated" else "disagg"
        return f"{mode} {self.shape_label()} c{self.concurrency}"

    def as_dict(self) -> dict[str, object]:
        out: dict[str, object] = {"mode": self.mode, "label": self.label(), "gpus": self.gpus,
                                  "concurrency": self.concurrency}
        if self.mode == "aggregated":
            out["replica"] = self.replica.as_dict()
            out["workers"] = {"replicas": self.replica.instances}
        else:
            out["prefill"] = self.prefill.as_dict()
            out["decode"] = self.decode.as_dict()
            out["workers"] = {"prefill": self.prefill.instances, "decode": self.decode.instances}
        out["engine"] = {"max_num_batched_tokens": self.max_num_batched_tokens,
                         "max_num_seqs": self.max_num_seqs,
                         "long_prefill_token_threshold": self.long_prefill_token_threshold,
                         "prefill_schedule_interval": self.prefill_schedule_interval,
                         "kernel_launch": self.kernel_launch,
                         "cpu_offload_gib": self.cpu_offload_gib,
                         "attention_backend": self.attention_backend,
                         "draft_attention_backend": self.draft_attention_backend,
                         "frontend": self.frontend}
        return {**out, **self.extras}


# ---------------------------------------------------------------- labels

LABEL_FORMS = ("a replica plan such as dp8-ep8 or tp4 (degrees tp, pp, dp, ep, moetp, pcp, dcp, "
               "eplb (redundant experts, dp72-ep72-eplb32) and sp), Rx[plan] such as 2x[tp4], or xP[plan]yD[plan] such as "
               "1P[dp4-ep4]1D[dp8-ep8]")
_DEGREES = {"tp": "tp", "pp": "pp", "dp": "dp", "ep": "ep", "moetp": "moe_tp", "pcp": "pcp",
            "dcp": "dcp", "eplb": "redundant_experts"}
_AGGREGATED = re.compile(r"(?:(\d+)x\[([^\]]+)\]|([^\[\]]+))")
_DISAGGREGATED = re.compile(r"(\d+)P\[([^\]]+)\](\d+)D\[([^\]]+)\]")


@dataclass(frozen=True)
class DeploymentShape:
    """A parsed label: the plans and worker counts, without chips or engine settings.
    `replicas` is None where the label leaves it to the GPU budget (`resolve`)."""

    mode: str
    replica: ParallelPlan | None = None
    replicas: int | None = None
    prefill: ParallelPlan | None = None
    prefill_workers: int = 0
    decode: ParallelPlan | None = None
    decode_workers: int = 0

    def resolve(self, gpus: int | None, flag: str = "--deployment") -> tuple[DeploymentShape, int]:
        """(the shape with its replica count, its GPUs), checked against a GPU budget `gpus`
        (None: the label's own)."""
        if self.mode == "aggregated":
            per = self.replica.gpus
            replicas = self.replicas
            if replicas is None:
                if gpus is not None and gpus % per:
                    raise ServecastError(f"{flag} {self.replica.label()}: --gpus {gpus} is not a "
                                         f"multiple of the replica's {per} GPUs")
                replicas = 1 if gpus is None else gpus // per
            shape = DeploymentShape("aggregated", self.replica, replicas)
            total = replicas * per
        else:
            shape = self
            total = (self.prefill_workers * self.prefill.gpus
                     + self.decode_workers * self.decode.gpus)
        if gpus is not None and gpus != total:
            raise ServecastError(f"{flag}: the deployment uses {total} GPUs, --gpus says {gpus}")
        return shape, total


def parse_plan_label(text: str, flag: str = "--deployment") -> ParallelPlan:
    """A `ParallelPlan.label()` string back to its plan (MoE grouping as written; the caller
    normalizes it for the architecture)."""
    if text == "single":
        return ParallelPlan()
    degrees: dict[str, object] = {}
    for part in text.split("-"):
        m = re.fullmatch(r"(tp|pp|dp|ep|moetp|pcp|dcp|eplb)(\d+)|(sp)", part)
        if m is None:
            raise _label_error(text, flag, f"{part!r} is not a degree")
        name = "sp" if m.group(3) else _DEGREES[m.group(1)]
        if name in degrees:
            raise _label_error(text, flag, f"{part!r} repeats a degree")
        value = True if m.group(3) else int(m.group(2))
        if value is not True and value < (0 if name == "redundant_experts" else 1):
            raise _label_error(text, flag, f"{part!r} must be at least 1")
        degrees[name] = value
    return ParallelPlan(**degrees)


def parse_deployment_label(text: str, flag: str = "--deployment") -> DeploymentShape:
    """`dp8-ep8`, `2x[tp4]` or `1P[dp4-ep4]1D[dp8-ep8]` (a leading `agg ` / `disagg ` is
    accepted) as a `DeploymentShape`; one error line naming `flag` otherwise."""
    label = re.sub(r"^(agg|disagg)\s+", "", text.strip())
    m = _DISAGGREGATED.fullmatch(label)
    if m is not None:
        x, y = int(m.group(1)), int(m.group(3))
        if x < 1 or y < 1:
            raise _label_error(text, flag, "worker counts must be at least 1")
        return DeploymentShape("disaggregated", prefill=parse_plan_label(m.group(2), flag),
                               prefill_workers=x, decode=parse_plan_label(m.group(4), flag),
                               decode_workers=y)
    m = _AGGREGATED.fullmatch(label)
    if m is None or not label:
        raise _label_error(text, flag, "not a deployment label")
    if m.group(1) is not None:
        replicas = int(m.group(1))
        if replicas < 1:
            raise _label_error(text, flag, "the replica count must be at least 1")
        return DeploymentShape("aggregated", parse_plan_label(m.group(2), flag), replicas)
    return DeploymentShape("aggregated", parse_plan_label(m.group(3), flag))


def _label_error(text: str, flag: str, what: str) -> ServecastError:
    return ServecastError(f"{flag} {text!r}: {what}; allowed: {LABEL_FORMS}")

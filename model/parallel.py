"""Parallel plans: how one model replica is spread over GPUs.

Degrees follow vLLM / aiconfigurator semantics:
- attention and dense layers: `tp` tensor parallel x `dp` attention data parallel (DEP when
  dp > 1 with expert parallelism), x `pcp` prefill context parallel ranks;
- MoE layers: the same GPUs regrouped as `moe_tp` x `ep` (moe_tp * ep == tp * dp * pcp);
- `dcp` decode context parallel shards the KV along the sequence inside the TP group
  (dcp divides tp; KV is no longer duplicated across those ranks);
- `pp` pipeline stages multiply everything; `sp` shards norms/activations along tokens in TP.
"""

from __future__ import annotations

from dataclasses import dataclass


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
        return "-".join(parts + (["sp"] if self.sp else [])) or "single"

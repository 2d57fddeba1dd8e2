"""Build the CDNA3 MoE kernel table from AITER's tuned fused-MoE configurations.

AITER (https://github.com/ROCm/aiter, MIT) is the kernel library vLLM and SGLang run on AMD
Instinct GPUs. Its tuner times every candidate fused-MoE kernel per layer shape and keeps the
fastest in `aiter/configs/**/*tuned_fmoe*.csv`, keyed by the GPU's compute-unit count. The rows
with `cu_num` 304 are the MI300X / MI325X die (gfx942, 304 CUs; both chips select the same
tuned kernels); `us` is the tuned kernel time of both GEMM stages, in microseconds.

    python -m model.fit.aiter_moe <aiter git dir> [commit]

writes `data/calibration/ops/cdna3_304cu/moe.parquet` in the schema of the other `moe.parquet`
tables (one row per tuned shape, `latency` in ms). What the rows are, and what they leave out,
is in data/calibration/ops/README.md.
"""

from __future__ import annotations

import csv
import io
import subprocess
import sys
from pathlib import Path

import pandas as pd

from model.fit.kernel_tables import OPS_DIR

CHIP = "cdna3_304cu"
CU_NUM = "304"
# AITER quantization kinds -> the table dtypes of data/calibration/ops (kernel_tables.DTYPE)
MOE_DTYPES = {("QuantType.per_1x128", "torch.float8_e4m3fnuz"): "fp8_block",
              ("QuantType.No", "torch.bfloat16"): "bfloat16"}
DISTRIBUTION = "uniform_random"  # the tuner routes random tokens (no power-law skew)


def _git(gitdir: Path, *args: str) -> str:
    return subprocess.run(["git", "--git-dir", str(gitdir), *args], check=True,
                          capture_output=True, text=True).stdout


def tuned_files(gitdir: Path, commit: str) -> list[str]:
    names = _git(gitdir, "ls-tree", "-r", "--name-only", commit, "aiter/configs").split()
    return sorted(n for n in names if n.endswith(".csv") and "tuned_fmoe" in n
                  and "untuned" not in n)


def rows_of(text: str, path: str, commit: str) -> list[dict]:
    """The 304-CU rows of one tuned CSV with a format the table knows and a positive time."""
    out = []
    for r in csv.DictReader(io.StringIO(text)):
        kind = MOE_DTYPES.get((r.get("q_type"), r.get("q_dtype_w")))
        if str(r.get("cu_num")) != CU_NUM or kind is None or float(r["us"]) <= 0:
            continue
        out.append({"framework": "AITER", "version": commit[:12],
                    "device": "AMD Instinct gfx942, 304 CUs (MI300X / MI325X)", "op_name": "moe",
                    "kernel_source": f"{path}: {r['kernelName1']} + {r['kernelName2']}".strip(),
                    "moe_dtype": kind, "num_tokens": int(r["token"]),
                    "hidden_size": int(r["model_dim"]), "inter_size": int(r["inter_dim"]),
                    "topk": int(r["topk"]), "num_experts": int(r["expert"]), "moe_tp_size": 1,
                    "moe_ep_size": 1, "distribution": DISTRIBUTION,
                    "latency": float(r["us"]) * 1e-3})
    return out


def build(gitdir: Path, commit: str = "HEAD") -> pd.DataFrame:
    commit = _git(gitdir, "rev-parse", commit).strip()
    rows = []
    for path in tuned_files(gitdir, commit):
        rows += rows_of(_git(gitdir, "show", f"{commit}:{path}"), path, commit)
    return pd.DataFrame(rows)


def main(argv: list[str] | None = None) -> None:
    """Build data/calibration/ops/<die>/moe.parquet from AITER's tuned fused-MoE tables."""
    import argparse

    ap = argparse.ArgumentParser(prog="python -m model.fit.aiter_moe", description=main.__doc__)
    ap.add_argument("gitdir", type=Path, help="a git directory of ROCm/aiter")
    ap.add_argument("commit", nargs="?", default="HEAD", help="the commit to read (HEAD)")
    args = ap.parse_args(sys.argv[1:] if argv is None else argv)
    df = build(args.gitdir, args.commit)
    out = OPS_DIR / CHIP / "moe.parquet"
    out.parent.mkdir(parents=True, exist_ok=True)
    df.to_parquet(out, index=False)
    print(f"{out}: {len(df)} rows, {df.moe_dtype.value_counts().to_dict()}")


if __name__ == "__main__":
    main()

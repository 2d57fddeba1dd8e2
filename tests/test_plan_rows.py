"""The vLLM AgentX post's three deployments (seed 000; research/theory.md §1.0), planned with
documented deployment recipes (data/deployments/), AgentX v1.0 traffic as SemiAnalysis states it
(`agentx-v1`: agentx-synthetic's sessions with v1.0's gap and output laws, model.fit.workload)
and the finite prefix cache; no per-row factors.

What the model says about each row (the issue asks for 25%; the closing note gives the figures):
- DeepSeek V4 Pro on 12 GB300, 83K TPGS at 256 sessions: within 25% (-16%), on the post's
  deployment shape (one DEP4 prefill tray, one DEP8 decode pair of trays). Since the decode
  workers carry their calibrated disaggregated factor (model.fit.engine, 2026-12-03) the four
  decode GPUs of the mirror split no longer keep up at 50 tok/s; the post's shape meets the SLO
  up to its prefill worker's saturation, which the search reaches at ~500 sessions (the post
  stopped at 256, where the model gives 62K).
- MiniMax M3 on 2 B300, 70K at 24 sessions: InferenceX's AgentX recipe for this very point (TP2,
  24 sessions) serves NVIDIA's experts-only NVFP4 export with an FP8 index-key cache, so the KV
  pool is ~129 GB per GPU, not the ~35 GB MXFP8 would leave. At the post's 24 sessions: within
  25% (-15%), but the model's P90 interactivity there is ~1.5x the post's 74 tok/s, so the free
  search runs on to ~60 sessions and over-predicts ~1.6x (the same recipe also ran TP2 at 32
  and 40 sessions, InferenceX commit dd8abfbe, and the post kept 24: the real engine slows
  faster with the batch than the model). Read as InferenceX's E2E normalized interactivity the
  model gives 80 tok/s at 24 sessions, but that reading would sink the DeepSeek row.
- Kimi K3 on 16 GB300, 11.8K at 48 sessions: within 25% (+6%) since its weight-only MXFP4 experts
  compute at the BF16 rate (mxfp4_w4a16, 2026-12-03; before, FP4 tensor-core math put them
  4-6x too fast in prefill and the free search at +67%). The best is disaggregated, a DP4
  attention prefill worker (DCP2: prefill plans carry DCP since 2026-12-03) and a DCP8 decode
  worker, but at ~230 sessions with most of them waiting in the prefill queue (the SLO leaves
  TTFT free; mean TTFT ~2 min). The best aggregated deployment uses DCP, as the post says, at
  ~0.7x the post's TPGS (its P90 interactivity binds at ~33 sessions).
"""

import pytest

from model.plan.planner import POST_ROWS, plan
from model.plan.search_cache import tier_hits
from model.specs.recipes import load_recipes, recipe_for

ROW = {r["arch"]: r for r in POST_ROWS}
SLO = 50.0  # the post's "P90 interactivity > 50 tok/s"


def test_recipes_are_sourced_and_match_the_checkpoints():
    for r in load_recipes():
        assert r.precision_source and r.kv_dtype_source and r.spec_source and r.date
    # InferenceX golden acceptance lengths on SPEED-Bench coding (data/deployments/*.yaml):
    # DSV4 MTP k=3 -> 2.49, MiniMax M3 EAGLE3 k=3 -> 2.83, Kimi K3 DSpark k=7 -> 3.78
    assert recipe_for("deepseek-v4-pro").spec == (3, 2.49, "mtp")
    assert recipe_for("minimax-m3").spec == (3, 2.83, "eagle3")
    assert recipe_for("kimi-k3").spec == (7, 3.78, "dspark")
    # MiniMax M3: MXFP8 checkpoint (BF16's 852 GB cannot fit 2 x B300), FP8 GQA cache; on
    # NVFP4 chips NVIDIA's experts-only NVFP4 export with an FP8 index-key cache (InferenceX
    # minimaxm3 b300-fp4-mtp and h200-fp8-mtp AgentX recipes).
    from model.specs.hardware import load_hardware

    m3 = recipe_for("minimax-m3")
    assert (m3.precision, m3.kv_dtype) == ("mxfp8", "fp8")
    assert m3.precision_on(load_hardware("b300")) == "experts=nvfp4,indexer_cache=fp8"
    assert m3.precision_on(load_hardware("h200-sxm")) == "mxfp8"
    # the B300 recipe drafts with Inferact/MiniMax-M3-EAGLE3-GQA, golden AL 2.78 at 3 tokens
    # (InferenceX golden_al_distribution/minimaxm3_eagle3_gqa.yaml); H200 keeps the MHA head, 2.83
    assert m3.spec_on(load_hardware("b300")) == (3, 2.78, "eagle3")
    assert m3.draft_on(load_hardware("b300")) == "Inferact/MiniMax-M3-EAGLE3-GQA"
    assert m3.draft_on(load_hardware("h200-sxm")) == "Inferact/MiniMax-M3-EAGLE3"
    # DeepSeek V4: vLLM blog 2026-04-24 --kv-cache-dtype fp8 (+ fp4 indexer, the arch default)
    assert recipe_for("deepseek-v4-pro").kv_dtype == "fp8"
    assert recipe_for("qwen3-32b") is None


def test_hit_rate_answers_to_capacity_and_policy():
    from model.specs.workload import load_workload

    w = load_workload("agentx")
    # Unlimited HBM: every session's prefix survives -> the trace's infinite-cache hit
    # (96.3% on the derived CSV, research/workloads.md §1.6; >96% in the post).
    hbm, low, inf = tier_hits(w, {"hbm": 1e12}, [64.0])
    assert hbm[0] == pytest.approx(inf, abs=1e-9) and low[0] == 0 and 0.95 < inf < 0.97
    # 6M tokens of HBM shared by more sessions hits less, and a host tier behind it recovers
    # most of the loss (Che closed form, model.serve.cache_model).
    small = [tier_hits(w, {"hbm": 6e6}, [s])[0][0] for s in (16.0, 64.0, 256.0)]
    assert small[0] > small[1] > small[2]
    hbm2, low2, _ = tier_hits(w, {"hbm": 6e6, "host": 3.7e7}, [256.0])
    assert hbm2[0] == pytest.approx(small[2]) and hbm2[0] + low2[0] > small[2] + 0.2
    # second-hit admits a turn's growth only when seen again: it never beats LRU on append-only
    # sessions (model.serve.cache_model docstring)
    lru = tier_hits(w, {"hbm": 6e6}, [64.0], "lru")[0][0]
    second = tier_hits(w, {"hbm": 6e6}, [64.0], "second-hit")[0][0]
    assert second < lru


WORKLOAD = "agentx-v1"


@pytest.mark.slow
def test_deepseek_v4_pro_on_12_gb300_row():
    post = ROW["deepseek-v4-pro"]
    r = plan("deepseek-v4-pro", "gb300-nvl72", 12, WORKLOAD, SLO)
    best = r.best
    assert best["tpgs"] == pytest.approx(post["tpgs"], rel=0.25)
    assert best["mode"] == "disaggregated" and best["gpus"] == 12
    # the post's shape, held at the SLO by its one prefill worker, not by decode (measured
    # 2026-12-03: 513 sessions, P90 interactivity 65 tok/s, limit prefill_rate)
    assert (best["plan"], best["decode_plan"], best["x"], best["y"]) == ("dp4-ep4", "dp8-ep8", 1, 1)
    assert best["limit"] == "prefill_rate" and best["concurrency"] >= post["concurrency"]
    c = r.candidates
    post_shape = c[(c["mode"] == "disaggregated") & (c["plan"] == "dp4-ep4")
                   & (c["decode_plan"] == "dp8-ep8") & (c["x"] == 1) & (c["y"] == 1)
                   & c["feasible"] & (c["p90_interactivity_tok_s"] >= SLO)]
    assert post_shape["tpgs"].max() == pytest.approx(post["tpgs"], rel=0.25)


@pytest.mark.slow
def test_minimax_m3_on_2_b300_row():
    post = ROW["minimax-m3"]
    # at the post's 24 sessions (seed 000 table: 70K TPGS at P90 74.2 tok/s): within 25%,
    # aggregated on the two GPUs, the lanes the limit (the NVFP4 pool holds every session)
    at_post = plan("minimax-m3", "b300", 2, WORKLOAD, SLO, concurrency=[post["concurrency"]])
    assert at_post.best["tpgs"] == pytest.approx(post["tpgs"], rel=0.25)
    assert at_post.best["mode"] == "aggregated" and at_post.best["gpus"] == 2
    assert at_post.best["limit"] == "lanes"
    # the known miss (module docstring): interactivity at 24 sessions ~1.5x the post's, so the
    # free search serves ~1.6x the post's TPGS at more sessions
    assert at_post.best["p90_interactivity_tok_s"] > 1.3 * post["p90_interactivity_tok_s"]
    free = plan("minimax-m3", "b300", 2, WORKLOAD, SLO)
    assert 1.25 < free.best["tpgs"] / post["tpgs"] < 2.0
    assert free.best["concurrency"] > 2 * post["concurrency"]
    # served as MXFP8 (the H200 recipe's checkpoint), 221 GB of weights per GPU leave a KV pool
    # for a handful of v1.0's long contexts: KV capacity binds, far lower throughput
    mx = plan("minimax-m3", "b300", 2, WORKLOAD, SLO, precision="mxfp8")
    assert mx.best["limit"] == "kv_capacity" and mx.best["decode_batch"] < 10
    assert mx.best["tpgs"] < 0.6 * free.best["tpgs"]


@pytest.mark.slow
def test_kimi_k3_on_16_gb300_row():
    # Post: 11.8K at 48 sessions, "Kimi K3 uses DCP instead of TP". The free search lands within
    # the 25% (measured 12.46K, +5.6%), disaggregated; the best aggregated deployment
    # uses DCP and serves less (measured 8.3K at 33 sessions, P90 interactivity binding).
    post = ROW["kimi-k3"]
    best = plan("kimi-k3", "gb300-nvl72", 16, WORKLOAD, SLO)
    assert best.best["tpgs"] == pytest.approx(post["tpgs"], rel=0.25)
    assert best.best["mode"] == "disaggregated"
    agg = plan("kimi-k3", "gb300-nvl72", 16, WORKLOAD, SLO, modes=("aggregated",))
    assert "dcp" in agg.deployment.label()
    assert 0.55 < agg.best["tpgs"] / post["tpgs"] < 0.85
    assert best.best["tpgs"] > agg.best["tpgs"]

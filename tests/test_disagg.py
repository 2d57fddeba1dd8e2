"""P/D disaggregation: saturation, rate matching, xPyD ratios (papers/research/theory.md §7)."""

import numpy as np
import pytest

from model.plan.disagg import (
    decode_saturation,
    mdl_wait_s,
    prefill_saturation_rps,
    rate_matched_ratio,
    ratio_sweep,
    system_rate_rps,
    xpyd_grid,
    xpyd_rates,
)


def test_scaling_book_pd_ratio_t10():
    # papers/research/theory.md §13 T10 (scaling book): T_prefill 0.91 s, decode B=32 at T_step 0.019 s, L_out 512
    # -> P/G = 0.91*32/(0.019*512) = 2.99 prefill servers per generate server.
    lam_p = prefill_saturation_rps(0.91, 8192, 8192)  # one 8192-token prompt per 0.91 s
    rate, inter, best = decode_saturation(np.array([32.0]), np.array([0.019]), 512)
    assert rate[0] == pytest.approx(32 / (512 * 0.019))
    assert inter[0] == pytest.approx(1 / 0.019)
    assert rate_matched_ratio(lam_p, rate[0]) == pytest.approx(2.99, rel=2e-3)


def test_decode_saturation_largest_batch_meeting_slo_and_kv():
    # Step time 10 ms + 0.5 ms per sequence; SLO 50 tok/s -> T <= 20 ms -> B <= 20.
    batch = np.array([1.0, 8, 16, 20, 24, 32])
    step = 0.010 + 0.0005 * batch
    rate, inter, best = decode_saturation(batch, step, 100, slo_tokens_per_s=50)
    assert batch[best] == 20
    assert rate[best] == pytest.approx(20 / (100 * 0.020))
    # KV fits only 16 sequences: the saturating batch drops to 16.
    _, _, best_kv = decode_saturation(batch, step, 100, slo_tokens_per_s=50, max_batch=16)
    assert batch[best_kv] == 16
    _, _, none = decode_saturation(batch, step, 100, slo_tokens_per_s=1000)
    assert none == -1


def test_xpyd_grid_and_system_rate():
    # 2-GPU prefill, 4-GPU decode instances in 8 GPUs: (1,1) uses 6, (2,1) uses 8; x=3 leaves 2.
    x, y = xpyd_grid(2, 4, 8)
    assert list(zip(x, y, strict=True)) == [(1, 1), (2, 1)]
    x, y = xpyd_grid(2, 4, 8, exact=True)
    assert list(zip(x, y, strict=True)) == [(2, 1)]
    # min(x*lam_P, y*lam_D): 2 prefill at 3 rps vs 1 decode at 5 rps -> 5 rps (decode-bound).
    assert system_rate_rps(2, 1, 3.0, 5.0) == 5.0
    assert system_rate_rps(1, 1, 3.0, 5.0) == 3.0


def test_mdl_wait_distserve_t18():
    # papers/research/theory.md §13 T18: M/D/1 with D = 1 s, R = 0.5/s: TTFT = D + R D^2 / (2 (1 - R D)) = 1.5 s.
    assert 1.0 + mdl_wait_s(1.0, 0.5) == pytest.approx(1.5)
    assert np.isinf(mdl_wait_s(1.0, 1.0))


def test_ratio_sweep_over_budgets_by_hand():
    # One 2-GPU prefill instance saturates at 3 req/s, one 4-GPU decode instance at 5 req/s;
    # 1,000 tokens per request (input incl. cached + output). Exact budgets only:
    #   6 GPUs: 1P1D -> min(3, 5) = 3 req/s, prefill-bound, 3*1000/6 = 500 TPGS, decode 40% idle
    #   8 GPUs: 2P1D -> min(6, 5) = 5 req/s, decode-bound, 625 TPGS, prefill 1/6 idle
    #  10 GPUs: 1P2D -> 3 req/s (300 TPGS) and 3P1D -> 5 req/s (500 TPGS)
    sweep = ratio_sweep(3.0, 2, 5.0, 4, [6, 7, 8, 10], tokens_per_request=1000)
    assert sweep["label"].tolist() == ["1P1D", "2P1D", "1P2D", "3P1D"]
    assert sweep["budget_gpus"].tolist() == [6, 8, 10, 10]  # 7 GPUs: no exact fill
    assert (sweep["gpus"] == sweep["budget_gpus"]).all()
    assert sweep["rate_rps"].tolist() == pytest.approx([3, 5, 3, 5])
    assert sweep["tpgs"].tolist() == pytest.approx([500, 625, 300, 500])
    assert sweep["limit"].tolist() == ["prefill", "decode", "prefill", "decode"]
    assert sweep["idle_fraction"].tolist() == pytest.approx([0.4, 1 / 6, 0.7, 4 / 9])
    assert sweep["p_per_d"].tolist() == pytest.approx([1, 2, 0.5, 3])
    assert ratio_sweep(3.0, 2, 5.0, 4, [1, 3]).empty  # nothing fits 1 or 3 GPUs


def test_tpgs_peaks_at_the_rate_matched_ratio_t10():
    # papers/research/theory.md §13 T10: lam_D / lam_P = 2.99 prefill per generate server. On a continuous
    # ratio, TPGS = min(r lam_P, lam_D) T / (r g_P + g_D) rises until r = lam_D / lam_P (the
    # prefill stage limits) and falls after (decode limits while prefill GPUs are added).
    lam_p = float(prefill_saturation_rps(0.91, 8192, 8192))
    lam_d = 32 / (512 * 0.019)
    ratios = np.geomspace(0.5, 20, 2001)
    curve = xpyd_rates(ratios, 1.0, lam_p, 8, lam_d, 8, tokens_per_request=8192 + 512)
    peak = ratios[int(np.argmax(curve["tpgs"]))]
    assert peak == pytest.approx(rate_matched_ratio(lam_p, lam_d), rel=3e-3)
    assert (curve["limit"][ratios < 2.9] == "prefill").all()
    assert (curve["limit"][ratios > 3.1] == "decode").all()
    # at the peak no stage idles; both capacities equal
    at = curve.iloc[int(np.argmax(curve["tpgs"]))]
    assert at["idle_fraction"] < 3e-3

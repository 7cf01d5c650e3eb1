"""The Amdahl consistency gate on fixed figures: the refuted CPU headlines (a DiT loop ten times
its own bound, a DiT+VAE ratio above the DiT ratio) are caught and their cause named; the H200
run's figures, which agree with their prediction, pass; a ratio whose interval spans 1.0 is level.
The job-time bootstrap is checked against direct computation."""

from __future__ import annotations

import numpy as np
import pytest

from audit.evidence import consistency as K
from audit.evidence.stats import bootstrap_total_ratio_ci

I = K.Interval


def test_amdahl_and_the_share_of_a_job_with_unchanged_time():
    assert K.amdahl(0.5, 2.0) == pytest.approx(4 / 3)
    assert K.amdahl(0.0, 50.0) == 1.0 and K.amdahl(1.0, 3.0) == pytest.approx(3.0)
    assert np.isnan(K.amdahl(1.2, 2.0)) and np.isnan(K.amdahl(0.5, 0.0)) and np.isnan(K.amdahl(None, 2.0))
    # 8 s of loop with half of it attention, plus 2 s of decode: attention is 40% of the job
    assert K.share_with_fixed_time(0.5, 8.0, 2.0) == pytest.approx(0.4)
    # the decode counted as unchanged time: (8 + 2) / (4 + 4/2 ... ) computed the long way
    loop_after = 8.0 * 0.5 + 8.0 * 0.5 / 4.0
    assert K.amdahl(K.share_with_fixed_time(0.5, 8.0, 2.0), 4.0) == pytest.approx(10.0 / (loop_after + 2.0))


def test_a_dit_loop_ten_times_its_own_bound_is_inconsistent():
    # the CPU demo's figures: DiT loop 11.36x (95% CI 9.06x to 14.31x), Amdahl 1.17x
    k = K.check_dit(I(11.36, 9.06, 14.31), 0.16, I(3.0, 2.6, 3.4))
    assert k.verdict == K.INCONSISTENT and k.inconsistent
    assert 1.1 < k.predicted.value < 1.2
    s = k.sentence()
    assert "inconsistent with the Amdahl bound" in s
    assert "measured 11.36x (95% CI 9.06x to 14.31x)" in s and "Amdahl predicted 1.1" in s
    assert "reference's time grew" in s  # the measured figure lies above: the reference paid extra


def test_a_loop_that_agrees_with_its_prediction_is_consistent():
    # DiT 1.05x [0.87, 1.27] against Amdahl 1.18x: the interval reaches the prediction
    k = K.check_dit(I(1.05, 0.87, 1.27), 0.2, I(3.7, 3.2, 4.2))
    assert k.verdict == K.CONSISTENT and "consistent with the Amdahl bound" in k.sentence()
    assert "inconsistent" not in k.sentence()


def test_dit_plus_vae_above_its_bound_names_the_decode():
    # DiT 1.05x, DiT+VAE 1.64x: with the decode the same work for both, the job cannot gain more
    # than the loop; the naive decode took 4.13 s and flash's 0.70 s
    op, p = I(3.7, 3.2, 4.2), 0.2
    assert K.check_dit(I(1.05, 0.87, 1.27), p, op).verdict == K.CONSISTENT
    k = K.check_dit_vae(I(1.64, 1.5, 1.8), p, op, dit_s=3.0, vae_ref_s=4.13, vae_core_s=0.70)
    assert k.verdict == K.INCONSISTENT
    assert k.predicted.value < K.check_dit(I(1.05, 0.87, 1.27), p, op).predicted.value
    assert "VAE decode" in k.cause and "4.13 s" in k.cause and "0.7 s" in k.cause


def test_a_slower_candidate_decode_is_named_when_the_figure_lies_below():
    k = K.check_dit_vae(I(1.0, 0.95, 1.05), 0.9, I(10.0, 9.0, 11.0), dit_s=10.0, vae_ref_s=1.0,
                        vae_core_s=6.0)
    assert k.verdict == K.INCONSISTENT and "6 s for the candidate" in k.cause


def test_the_h200_run_agrees_with_its_prediction():
    # the H200 research object of 2026-12-03: DiT 14.89x [14.80, 14.98], p 0.9786, s_op 20.59x; DiT+VAE 6.45x
    # with decodes of 4.60 s and 5.42 s after a 53.6 s naive loop
    op = I(20.5943, 20.3, 20.9)
    assert K.check_dit(I(14.8918, 14.803, 14.9806), 0.978625, op).verdict == K.CONSISTENT
    k = K.check_dit_vae(I(6.4498, 6.3, 6.6), 0.978625, op, 53.5989, 4.6028, 5.4246)
    assert k.verdict == K.CONSISTENT and 6.6 < k.predicted.value < 6.9


def test_the_tolerance_is_the_edge():
    pred = I(2.0, 2.0, 2.0)  # s_op fixed: amdahl(1.0, 2.0) = 2.0
    just_in = K.check("x", I(2.19, 2.19, 2.3), K.predicted_interval(1.0, pred))
    just_out = K.check("x", I(2.21, 2.21, 2.3), K.predicted_interval(1.0, pred))
    below = K.check("x", I(1.7, 1.7, 1.8), K.predicted_interval(1.0, pred))
    assert (just_in.verdict, just_out.verdict, below.verdict) == (K.CONSISTENT, K.INCONSISTENT, K.INCONSISTENT)
    assert "candidate's time grew" in below.cause
    assert K.check("x", I(1.9, 1.85, 1.95), K.predicted_interval(1.0, pred), tolerance=0.0).inconsistent


def test_without_a_prediction_or_an_interval_nothing_is_judged():
    nan = float("nan")
    k = K.check_dit(I(2.0, 1.5, 2.5), None, I(nan, nan, nan))
    assert k.verdict == K.NOT_CHECKED and "not checked" in k.sentence()
    assert K.check_dit(I(2.0, nan, nan), 0.5, I(2.0, 1.9, 2.1)).verdict == K.NOT_CHECKED
    d = K.check_dit(I(1.4, 1.2, 1.6), 0.5, I(2.0, 1.9, 2.1)).to_dict()  # predicted 1.33x
    assert d["verdict"] == K.CONSISTENT and d["measured"] == {"value": 1.4, "low": 1.2, "high": 1.6}
    assert "10%" in d["rule"]


def test_level_means_the_interval_spans_one():
    assert K.level(0.87, 1.27) and K.level(1.0, 1.3) and K.level(0.5, 1.0)
    assert not K.level(1.01, 1.4) and not K.level(0.5, 0.99)
    assert not K.level(None, 1.2) and not K.level(float("nan"), 2.0)


def test_an_end_to_end_figure_near_one_by_less_than_the_allowance_is_level():
    assert K.level_within_noise(I(0.965, 0.939, 0.993))  # 0.993 * 1.1 > 1
    assert K.level_within_noise(I(1.05, 1.02, 1.08))
    assert not K.level_within_noise(I(1.3, 1.2, 1.4))  # 1.2 / 1.1 > 1: a speedup shown
    assert not K.level_within_noise(I(0.87, 0.85, 0.9))  # 0.9 * 1.1 < 1: a slowdown shown
    assert not K.level_within_noise(I(1.0, float("nan"), 1.1))


def test_job_time_bootstrap_against_direct_computation():
    ref_steps, ref_vae = [1.0, 1.2, 1.1], [0.5, 0.7]
    core_steps, core_vae = [0.5, 0.6, 0.55], [0.6, 0.6]
    ci = bootstrap_total_ratio_ci([(ref_steps, "sum"), (ref_vae, "median")],
                                  [(core_steps, "sum"), (core_vae, "median")], seed=3)
    assert ci.ratio == pytest.approx((3.3 + 0.6) / (1.65 + 0.6))
    assert ci.low <= ci.ratio <= ci.high
    again = bootstrap_total_ratio_ci([(ref_steps, "sum"), (ref_vae, "median")],
                                     [(core_steps, "sum"), (core_vae, "median")], seed=3)
    assert (again.low, again.high) == (ci.low, ci.high)
    # constant samples: nothing to resample, the interval collapses onto the ratio
    flat = bootstrap_total_ratio_ci([([2.0, 2.0], "sum")], [([1.0, 1.0], "sum")])
    assert flat.low == flat.high == flat.ratio == 2.0
    assert "job times" in flat.to_dict()["method"]
    with pytest.raises(ValueError):
        bootstrap_total_ratio_ci([([], "sum")], [([1.0], "sum")])
    with pytest.raises(ValueError):
        bootstrap_total_ratio_ci([([1.0], "mean")], [([1.0], "sum")])


def test_job_time_bootstrap_covers_a_known_ratio():
    # 200 draws of noisy steps whose true loop-time ratio is 2.0: the 95% interval covers it
    # most of the time (a percentile bootstrap with 8 samples runs a little narrow)
    rng = np.random.default_rng(7)
    covered = 0
    for i in range(200):
        a, b = rng.normal(2.0, 0.2, 8), rng.normal(1.0, 0.1, 8)
        ci = bootstrap_total_ratio_ci([(a, "sum")], [(b, "sum")], resamples=1000, seed=i)
        covered += ci.low <= 2.0 <= ci.high
    assert covered >= 170


def test_dit_plus_vae_is_refuted_with_the_dit_loop_it_contains():
    op = I(3.0, 2.9, 3.1)
    loop = K.check_dit(I(0.191, 0.1217, 0.3324), 0.15, op)  # predicted ~1.11x: refuted
    assert loop.verdict == K.INCONSISTENT
    alone = K.check_dit_vae(I(0.5073, 0.2919, 0.95), 0.15, op, dit_s=2.3, vae_ref_s=20.0, vae_core_s=20.0)
    assert alone.verdict == K.CONSISTENT  # its wide interval reaches the widened prediction
    k = K.check_dit_vae(I(0.5073, 0.2919, 0.95), 0.15, op, dit_s=2.3, vae_ref_s=20.0, vae_core_s=20.0, dit=loop)
    assert k.verdict == K.INCONSISTENT and k.cause.startswith("it contains the DiT loop")
    assert "the DiT loop it contains" in k.to_dict()["rule"]
    ok = K.check_dit(I(1.05, 0.95, 1.2), 0.15, op)
    assert K.check_dit_vae(I(1.0, 0.95, 1.05), 0.15, op, 2.3, 20.0, 20.0, dit=ok).verdict == K.CONSISTENT

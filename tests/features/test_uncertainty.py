import numpy as np
import pytest

from mia_ray.errors import MiaError
from mia_ray.features import uncertainty as U
from mia_ray.registry import get, names

EPS = 1e-6
# One snippet, n = 4 predictions. Sorted: [0.1, 0.6, 0.6, 0.9]; mean P̄ = 2.2 / 4 = 0.55.
P = np.array([[0.9, 0.6, 0.6, 0.1]])
Y1 = np.array([1])
Y0 = np.array([0])

# Logs used below (natural log, 10 digits):
#   ln 0.9 = -0.1053605157   ln 0.6 = -0.5108256238   ln 0.1 = -2.3025850930
#   Σ p ln p = 0.9(-0.1053605157) + 2(0.6)(-0.5108256238) + 0.1(-2.3025850930)
#            = -0.0948244641 - 0.6129907486 - 0.2302585093 = -0.9380737220
SUM_PLOGP = -0.9380737220


def one(metric, p, y, eps=EPS):
    return float(get("uncertainty", metric)(p, y, eps)[0])


# --- hand-computed cases, one per metric ------------------------------------------------


def test_aleatoric_is_mean_of_p_times_1_minus_p():
    # p(1-p): 0.09, 0.24, 0.24, 0.09 -> sum 0.66 -> mean 0.165
    assert one("aleatoric", P, Y1) == pytest.approx(0.165, abs=1e-12)


def test_epistemic_is_population_variance():
    # deviations from 0.55: 0.35, 0.05, 0.05, -0.45 -> squares 0.1225, 0.0025, 0.0025, 0.2025
    # sum 0.33 -> / 4 = 0.0825 (ddof = 0, not 0.33 / 3 = 0.11)
    assert one("epistemic", P, Y1) == pytest.approx(0.0825, abs=1e-12)


def test_entropy_is_the_papers_sum_over_predictions():
    # H = -Σ p ln p = 0.9380737220 (see SUM_PLOGP); a Bernoulli entropy would differ
    assert one("entropy", P, Y1) == pytest.approx(0.9380737220, abs=1e-9)


def test_std_is_population_std():
    # sqrt(0.0825) = 0.2872281323
    assert one("std", P, Y1) == pytest.approx(0.2872281323, abs=1e-9)


def test_kl_mean():
    # Σ p ln(p / 0.55) = Σ p ln p - (Σ p) ln 0.55
    #   ln 0.55 = -0.5978370008; 2.2 * 0.5978370008 = 1.3152414018
    #   -0.9380737220 + 1.3152414018 = 0.3771676798
    assert one("kl_mean", P, Y1) == pytest.approx(0.3771676798, abs=1e-9)


def test_delta_max_and_delta_min():
    # max 0.9 - second max 0.6 = 0.3; second min 0.6 - min 0.1 = 0.5
    assert one("delta_max", P, Y1) == pytest.approx(0.3, abs=1e-12)
    assert one("delta_min", P, Y1) == pytest.approx(0.5, abs=1e-12)


def test_deltas_of_ties_are_zero():
    tied = np.array([[0.7, 0.2, 0.7, 0.2]])
    assert one("delta_max", tied, Y1) == 0.0
    assert one("delta_min", tied, Y1) == 0.0


def test_mean_median_even_and_odd_n():
    # even n: median of [0.1, 0.6, 0.6, 0.9] = (0.6 + 0.6) / 2 = 0.6 -> 0.55 - 0.6 = -0.05
    assert one("mean_median", P, Y1) == pytest.approx(-0.05, abs=1e-12)
    # odd n: [0.2, 0.3, 0.7], mean 1.2 / 3 = 0.4, median 0.3 -> 0.1
    assert one("mean_median", np.array([[0.7, 0.2, 0.3]]), Y1) == pytest.approx(0.1, abs=1e-12)


def test_manhattan_y1_and_y0():
    # y = 1: 0.1 + 0.4 + 0.4 + 0.9 = 1.8; y = 0: Σ p = 2.2
    assert one("manhattan", P, Y1) == pytest.approx(1.8, abs=1e-12)
    assert one("manhattan", P, Y0) == pytest.approx(2.2, abs=1e-12)


def test_euclidean_y1_and_y0():
    # y = 1: sqrt(0.01 + 0.16 + 0.16 + 0.81) = sqrt(1.14) = 1.0677078252
    # y = 0: sqrt(0.81 + 0.36 + 0.36 + 0.01) = sqrt(1.54) = 1.2409673646
    assert one("euclidean", P, Y1) == pytest.approx(1.0677078252, abs=1e-9)
    assert one("euclidean", P, Y0) == pytest.approx(1.2409673646, abs=1e-9)


def test_nll_y1_and_y0():
    # y = 1: -(ln 0.9 + 2 ln 0.6 + ln 0.1) = 0.1053605157 + 1.0216512475 + 2.3025850930
    #      = 3.4295968562; y = 0: 0
    assert one("nll", P, Y1) == pytest.approx(3.4295968562, abs=1e-9)
    assert one("nll", P, Y0) == 0.0


def test_chebyshev_y1_and_y0():
    # y = 1: max(0.1, 0.4, 0.4, 0.9) = 0.9; y = 0: max p = 0.9
    assert one("chebyshev", P, Y1) == pytest.approx(0.9, abs=1e-12)
    assert one("chebyshev", P, Y0) == pytest.approx(0.9, abs=1e-12)
    # a case where the two labels differ: y = 1 -> max(0.8, 0.7) = 0.8; y = 0 -> 0.3
    q = np.array([[0.2, 0.3]])
    assert one("chebyshev", q, Y1) == pytest.approx(0.8, abs=1e-12)
    assert one("chebyshev", q, Y0) == pytest.approx(0.3, abs=1e-12)


def test_kl_label_y1_and_y0():
    # y = 1 is clipped to 1 - 1e-6: Σ p ln p - 2.2 ln(1 - 1e-6)
    #   ln(1 - 1e-6) = -1.0000005e-6 -> -0.9380737220 + 2.2000011e-6 = -0.9380715220
    assert one("kl_label", P, Y1) == pytest.approx(-0.9380715220, abs=1e-9)
    # y = 0 is clipped to 1e-6: Σ p ln p - 2.2 ln(1e-6)
    #   ln(1e-6) = -13.8155105580 -> -0.9380737220 + 30.3941232276 = 29.4560495056
    assert one("kl_label", P, Y0) == pytest.approx(29.4560495056, abs=1e-8)


# --- clipping -------------------------------------------------------------------------------

# p with exact 0 and 1, eps = 0.01 so the clipped values are easy to follow: q = [0.01, 0.99].
EDGE = np.array([[0.0, 1.0]])


def test_entropy_clips_only_inside_the_log():
    # -(0 * ln 0.01 + 1 * ln 0.99) = -ln 0.99 = 0.0100503359
    assert one("entropy", EDGE, Y1, eps=0.01) == pytest.approx(0.0100503359, abs=1e-9)


def test_nll_clips_p():
    # y = 1: -(ln 0.01 + ln 0.99) = 4.6051701860 + 0.0100503359 = 4.6152205219; y = 0: 0
    assert one("nll", EDGE, Y1, eps=0.01) == pytest.approx(4.6152205219, abs=1e-9)
    assert one("nll", EDGE, Y0, eps=0.01) == 0.0


def test_kl_label_clips_p_and_y():
    # y = 0 -> 0.01: 0.01 ln(0.01/0.01) + 0.99 ln(0.99/0.01) = 0.99 * 4.5951198501 = 4.5491686516
    assert one("kl_label", EDGE, Y0, eps=0.01) == pytest.approx(4.5491686516, abs=1e-9)
    # y = 1 -> 0.99: 0.01 ln(0.01/0.99) + 0.99 ln 1 = -0.0459511985
    assert one("kl_label", EDGE, Y1, eps=0.01) == pytest.approx(-0.0459511985, abs=1e-9)


def test_kl_mean_uses_mean_of_clipped_p():
    # q̄ = (0.01 + 0.99) / 2 = 0.5: 0.01 ln 0.02 + 0.99 ln 1.98
    #   = 0.01(-3.9120230054) + 0.99(0.6830968447) = -0.0391202301 + 0.6762658763 = 0.6371456462
    assert one("kl_mean", EDGE, Y1, eps=0.01) == pytest.approx(0.6371456462, abs=1e-9)


def test_all_zero_and_all_one_predictions_stay_finite():
    zeros, ones = np.zeros((1, 10)), np.ones((1, 10))
    # q = eps everywhere and y clipped to eps: ln(eps / eps) = 0
    assert one("kl_label", zeros, Y0) == pytest.approx(0.0, abs=1e-15)
    # 10 (1 - 1e-6) ln((1 - 1e-6) / 1e-6) = 10 (0.999999)(13.8155095580) = 138.1549574
    assert one("kl_label", ones, Y0) == pytest.approx(138.1549574, abs=1e-6)
    # -10 ln(1e-6) = 138.1551055796
    assert one("nll", zeros, Y1) == pytest.approx(138.1551055796, abs=1e-8)
    feats = U.uncertainty_features(np.vstack([zeros, ones]), np.array([0, 1]))
    assert np.isfinite(feats).all()


# --- identical predictions ------------------------------------------------------------------


def test_certain_predictions_have_zero_aleatoric():
    assert one("aleatoric", np.ones((1, 4)), Y1) == 0.0
    assert one("aleatoric", np.zeros((1, 4)), Y1) == 0.0


@pytest.mark.parametrize(
    "metric", ["epistemic", "std", "kl_mean", "delta_max", "delta_min", "mean_median"]
)
def test_identical_predictions_have_no_spread(metric):
    same = np.full((1, 4), 0.3)
    assert one(metric, same, Y1) == pytest.approx(0.0, abs=1e-12)
    # and the test is not vacuous: a spread row is not 0
    assert abs(one(metric, np.array([[0.3, 0.3, 0.1, 0.8]]), Y1)) > 1e-3


def test_aleatoric_plus_epistemic_is_total_bernoulli_variance():
    # law of total variance: mean p(1-p) + var(p) = p̄(1 - p̄)
    p = np.random.default_rng(0).uniform(size=(50, 10))
    y = np.zeros(50)
    total = U.aleatoric(p, y, EPS) + U.epistemic(p, y, EPS)
    pbar = p.mean(axis=1)
    np.testing.assert_allclose(total, pbar * (1 - pbar), atol=1e-12)


# --- vectorisation, registry, assembly ------------------------------------------------------


def test_rows_are_independent():
    rng = np.random.default_rng(1)
    p = rng.uniform(size=(7, 10))
    p[0, :3] = [0.0, 1.0, 1.0]  # clipped values in a row mixed with others
    y = np.array([0, 1, 1, 0, 1, 0, 0])
    stacked = U.uncertainty_features(p, y)
    assert stacked.shape == (7, 13)
    for i in range(len(p)):
        np.testing.assert_allclose(
            stacked[i], U.uncertainty_features(p[i : i + 1], y[i : i + 1])[0]
        )


def test_registry_lists_exactly_the_13_metrics():
    assert names("uncertainty") == sorted(U.METRICS)
    assert len(U.METRICS) == 13
    assert get("uncertainty", "kl_label") is U.kl_label
    assert get("uncertainty", "aleatoric") is U.aleatoric


def test_features_are_in_paper_order():
    # the hand-computed values above, in METRICS order; all 13 differ, so a swap fails
    expected_y1 = [0.165, 0.0825, 0.9380737220, 0.2872281323, 0.3771676798, 0.3, 0.5, -0.05,
                   1.8, 1.0677078252, 3.4295968562, 0.9, -0.9380715220]  # fmt: skip
    expected_y0 = [0.165, 0.0825, 0.9380737220, 0.2872281323, 0.3771676798, 0.3, 0.5, -0.05,
                   2.2, 1.2409673646, 0.0, 0.9, 29.4560495056]  # fmt: skip
    feats = U.uncertainty_features(np.vstack([P, P]), np.array([1, 0]))
    np.testing.assert_allclose(feats, [expected_y1, expected_y0], rtol=0, atol=1e-8)
    assert U.METRICS[0] == "aleatoric" and U.METRICS[-1] == "kl_label"


def test_feature_names():
    got = U.feature_names("mcd")
    assert got == [f"mcd.{m}" for m in U.METRICS]
    assert got[0] == "mcd.aleatoric" and got[10] == "mcd.nll" and len(got) == 13


def test_no_snippets_gives_empty_table():
    assert U.uncertainty_features(np.zeros((0, 10)), np.zeros(0)).shape == (0, 13)


# --- errors ---------------------------------------------------------------------------------


@pytest.mark.parametrize(
    ("p", "y", "kw", "match"),
    [
        (np.array([0.1, 0.2]), np.array([1]), {}, r"p must be 2-D .*shape \(2,\)"),
        (np.zeros((1, 0)), np.array([1]), {}, r"at least one prediction.*\(1, 0\)"),
        (np.array([[0.1, np.nan]]), np.array([1]), {}, r"p must be finite; found nan at row 0, column 1"),
        (np.array([[0.1, 1.2]]), np.array([1]), {}, r"within \[0, 1\].*found 1\.2 at row 0, column 1"),
        (np.array([[-0.5, 0.2]]), np.array([1]), {}, r"within \[0, 1\].*found -0\.5 at row 0, column 0"),
        (np.array([[0.1, 0.2]]), np.array([[1]]), {}, r"y must be 1-D .*shape \(1, 1\)"),
        (np.array([[0.1, 0.2]]), np.array([1, 0]), {}, r"y has 2 labels but p has 1 rows"),
        (np.array([[0.1, 0.2]] * 2), np.array([1, 0.5]), {}, r"labels 0 or 1; found 0\.5 at index 1"),
        (np.array([[0.1, 0.2]]), np.array([1]), {"eps": 0.0}, r"eps must lie in \(0, 0\.5\), got 0\.0"),
        (np.array([[0.1, 0.2]]), np.array([1]), {"eps": 0.5}, r"eps must lie in \(0, 0\.5\), got 0\.5"),
        ([["a", "b"]], [1], {}, r"must be numeric"),
        (np.array([[0.3]]), np.array([1]), {}, r"delta_max needs at least 2 predictions"),
    ],
)  # fmt: skip
def test_bad_input_raises_clear_error(p, y, kw, match):
    with pytest.raises(MiaError, match=match):
        U.uncertainty_features(p, y, **kw)


def test_deltas_need_two_predictions():
    one_pred = np.array([[0.3], [0.6]])
    y = np.array([1, 0])
    with pytest.raises(MiaError, match=r"delta_max needs at least 2 .*n_samples = 1"):
        U.delta_max(one_pred, y, EPS)
    with pytest.raises(MiaError, match=r"delta_min needs at least 2 .*n_samples = 1"):
        U.delta_min(one_pred, y, EPS)
    # the other metrics are defined for n = 1
    assert U.std(one_pred, y, EPS).tolist() == [0.0, 0.0]


def test_each_metric_validates_on_its_own():
    for m in U.METRICS:
        with pytest.raises(MiaError, match="within"):
            get("uncertainty", m)(np.array([[0.1, 1.5]]), np.array([1]), EPS)

import json

import numpy as np
import pytest

from mia_ray.detectors.blind import BlindBagOfWords, blind_baseline
from mia_ray.errors import MiaError
from mia_ray.stats.metrics import roc_auc

COMMON = [f"w{i}" for i in range(200)]


def random_texts(rng, n, vocab, length=30):
    return [" ".join(rng.choice(vocab, length)) for _ in range(n)]


def test_recovers_a_distinctive_vocabulary():
    rng = np.random.default_rng(0)
    members = [t + " harbour lantern" for t in random_texts(rng, 40, COMMON)]
    nonmembers = [t + " desert cactus" for t in random_texts(rng, 40, COMMON)]
    r = blind_baseline(members + nonmembers, [1] * 40 + [0] * 40, bootstrap=200)
    assert r["auc"] > 0.9 and r["balanced_accuracy"] > 0.9
    assert r["method"] == "tfidf+logreg, k-fold CV"
    json.dumps(r, allow_nan=False)


def test_invents_no_signal_on_iid_texts():
    rng = np.random.default_rng(1)
    texts = random_texts(rng, 120, COMMON)
    labels = rng.permutation([1] * 60 + [0] * 60)
    r = blind_baseline(texts, labels, bootstrap=200)
    lo, hi = r["auc_ci"]
    assert lo < 0.5 < hi


def test_grouping_keeps_a_document_out_of_its_own_training_fold():
    # Each document's snippets share a document-specific word; labels are random per
    # document. Without groups that word leaks the label across folds; with them it cannot.
    rng = np.random.default_rng(2)
    n_docs, per_doc = 30, 4
    doc_label = rng.permutation([1] * 15 + [0] * 15)
    texts, labels, groups = [], [], []
    for d in range(n_docs):
        for t in random_texts(rng, per_doc, COMMON, length=10):
            texts.append(f"{t} doc{d}x doc{d}y")
            labels.append(doc_label[d])
            groups.append(d)
    model = BlindBagOfWords(folds=5, seed=0)
    leaky = model.oof_scores(texts, labels)
    assert roc_auc(leaky, labels) > 0.9
    r = blind_baseline(texts, labels, groups=groups, bootstrap=200)
    assert r["auc_ci"][0] < 0.5 < r["auc_ci"][1]
    assert r["method"] == "tfidf+logreg, k-fold grouped CV"


def test_oof_scores_are_seeded_probabilities():
    rng = np.random.default_rng(3)
    texts = random_texts(rng, 30, COMMON, length=8)
    labels = [1, 0] * 15
    a = BlindBagOfWords(seed=4).oof_scores(texts, labels)
    assert a.shape == (30,) and ((a > 0) & (a < 1)).all()
    np.testing.assert_array_equal(a, BlindBagOfWords(seed=4).oof_scores(texts, labels))


def test_fit_then_score_samples():
    model = BlindBagOfWords().fit(
        ["red apple", "green pear", "red cherry", "green lime"], [1, 0, 1, 0]
    )
    s = model.score_samples(["red red", "green green"])
    assert s[0] > 0.5 > s[1]
    assert model.get_params()["max_features"] == 20000


def test_errors():
    with pytest.raises(MiaError, match="need both members and non-members"):
        BlindBagOfWords().oof_scores(["a b", "c d"], [1, 1])
    with pytest.raises(MiaError, match="3 texts but 2 labels"):
        BlindBagOfWords().oof_scores(["a", "b", "c"], [1, 0])
    with pytest.raises(MiaError, match="must be a string"):
        BlindBagOfWords().oof_scores(["a b", None], [1, 0])
    with pytest.raises(MiaError, match="call fit"):
        BlindBagOfWords().score_samples(["a"])
    with pytest.raises(MiaError, match="cannot cross-validate"):
        blind_baseline(["a b", "c d", "e f"], [1, 0, 0])

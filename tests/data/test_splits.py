import pytest

from mia_ray.data.splits import (
    check_classes,
    copycheck_experiment,
    iid_member_split,
    sample_per_class,
)
from mia_ray.errors import MiaError

IDS = [f"d{i:03d}" for i in range(101)]


def test_iid_member_split_is_exact_seeded_and_order_free():
    split = iid_member_split(IDS, member_fraction=0.3, seed=7)
    assert sorted(split) == IDS
    assert sum(split.values()) == 30  # floor(0.3 * 101 + 0.5)
    assert iid_member_split(list(reversed(IDS)), 0.3, seed=7) == split
    assert iid_member_split(IDS, 0.3, seed=8) != split
    assert sum(iid_member_split(IDS[:5], 0.5, seed=0).values()) == 3  # 2.5 rounds half up


def test_iid_member_split_rejects_bad_input():
    with pytest.raises(MiaError, match="strictly between 0 and 1"):
        iid_member_split(IDS, 1.0)
    with pytest.raises(MiaError, match="'d000' more than once"):
        iid_member_split(IDS + ["d000"])


def test_sample_per_class_caps_each_class_independently():
    labels = {d: int(i < 20) for i, d in enumerate(IDS)}  # 20 members, 81 non-members
    sample = sample_per_class(labels, max_per_class=10, seed=3)
    assert sum(sample.values()) == 10 and len(sample) == 20
    assert all(labels[d] == y for d, y in sample.items())
    assert sample_per_class(dict(reversed(labels.items())), 10, seed=3) == sample
    # growing the non-members does not change which members are drawn
    more = labels | {f"x{i}": 0 for i in range(50)}
    members = {d for d, y in sample.items() if y == 1}
    assert {d for d, y in sample_per_class(more, 10, seed=3).items() if y == 1} == members
    assert sample_per_class(labels, 0, seed=3) == labels


def test_check_classes_messages():
    check_classes({"a": 1, "b": 0}, 1)
    with pytest.raises(MiaError, match=r"^only one class: 2 members and 0 non-members"):
        check_classes({"a": 1, "b": 1}, 1)
    with pytest.raises(
        MiaError,
        match=r"^too few documents: 3 members and 1 non-members, need at least 2 per class "
        r"\(data.min_docs_per_class\)$",
    ):
        check_classes({"a": 1, "b": 1, "c": 1, "d": 0}, 2)


def test_copycheck_experiment_sizes_and_disjointness():
    seen = [f"seen{i}" for i in range(50)]
    unseen = [f"new{i}" for i in range(150)]
    exp = copycheck_experiment(
        seen, unseen, n_suspected=50, n_unseen_in_suspected=10, n_unseen=50, seed=1
    )
    assert len(exp.suspected) == 50 and len(exp.unseen) == 50
    assert not set(exp.suspected) & set(exp.unseen)
    assert set(exp.unseen) <= set(unseen)
    assert sum(exp.truth[f] for f in exp.suspected) == 40  # seen among the suspected
    assert sum(f in set(unseen) for f in exp.suspected) == 10
    assert all(exp.truth[f] == 0 for f in exp.unseen)
    assert exp.pseudo_label == {f: 1 for f in exp.suspected} | {f: 0 for f in exp.unseen}
    assert exp.n_unseen_in_suspected == 10
    again = copycheck_experiment(list(reversed(seen)), unseen[::-1], 50, 10, 50, seed=1)
    assert again == exp


def test_copycheck_experiment_says_what_is_missing():
    with pytest.raises(MiaError, match=r"needs 40 seen files .*, 39 available"):
        copycheck_experiment([f"s{i}" for i in range(39)], [f"u{i}" for i in range(60)])
    with pytest.raises(MiaError, match=r"needs 60 unseen files .*, 59 available"):
        copycheck_experiment([f"s{i}" for i in range(40)], [f"u{i}" for i in range(59)])
    with pytest.raises(MiaError, match="both seen and unseen"):
        copycheck_experiment(
            ["a", "b"], ["b", "c"], n_suspected=1, n_unseen_in_suspected=0, n_unseen=1
        )

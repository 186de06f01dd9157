"""Member / non-member splits and class checks: pure Python + numpy, deterministic from a seed.

Every function sorts its input first, so the result depends on the set of ids and the
seed, never on the order in which Ray (or the file system) produced them.
"""

from __future__ import annotations

from collections.abc import Iterable
from dataclasses import dataclass, field
from itertools import pairwise

import numpy as np

from mia_ray.errors import MiaError


def _unique_sorted(ids: Iterable[str], what: str) -> list[str]:
    out = sorted(ids)
    for a, b in pairwise(out):
        if a == b:
            raise MiaError(f"{what} lists {a!r} more than once")
    return out


def iid_member_split(
    doc_ids: Iterable[str], member_fraction: float = 0.5, seed: int = 0
) -> dict[str, int]:
    """Draw members IID: ``{doc_id: 1 member / 0 non-member}``.

    Exactly ``floor(member_fraction * n + 0.5)`` members (round half up), chosen by a seeded
    permutation of the sorted ids.
    """
    if not 0 < member_fraction < 1:
        raise MiaError(f"member fraction must lie strictly between 0 and 1, not {member_fraction}")
    ids = _unique_sorted(doc_ids, "the document list")
    n_members = int(np.floor(member_fraction * len(ids) + 0.5))
    order = np.random.default_rng(seed).permutation(len(ids))
    members = {ids[i] for i in order[:n_members]}
    return {d: int(d in members) for d in ids}


def sample_per_class(labels: dict[str, int], max_per_class: int, seed: int = 0) -> dict[str, int]:
    """IID subsample of at most ``max_per_class`` documents per label; 0 or less keeps all.

    Each class is drawn with its own generator (seeded by ``(seed, label)``), so the sample
    of one class does not change when the other class grows.
    """
    if max_per_class <= 0:
        return dict(labels)
    out: dict[str, int] = {}
    for cls in sorted(set(labels.values())):
        ids = sorted(d for d, y in labels.items() if y == cls)
        if len(ids) > max_per_class:
            rng = np.random.default_rng([seed, int(cls)])
            ids = [ids[i] for i in sorted(rng.choice(len(ids), size=max_per_class, replace=False))]
        out.update((d, cls) for d in ids)
    return out


def check_classes(
    labels: dict[str, int], min_per_class: int, setting: str = "data.min_docs_per_class"
) -> None:
    """Raise ``MiaError`` unless both classes (1 member, 0 non-member) have ``min_per_class``
    docs; ``setting`` is the config key the message names for that minimum."""
    bad = sorted({y for y in labels.values() if y not in (0, 1)})
    if bad:
        raise MiaError(f"labels must be 0 or 1, found {bad[0]!r}")
    n1 = sum(1 for y in labels.values() if y == 1)
    n0 = len(labels) - n1
    if n0 == 0 or n1 == 0:
        raise MiaError(
            f"only one class: {n1} members and {n0} non-members; a membership audit needs "
            "both (label 1 = member, 0 = non-member)"
        )
    if min(n0, n1) < min_per_class:
        raise MiaError(
            f"too few documents: {n1} members and {n0} non-members, need at least "
            f"{min_per_class} per class ({setting})"
        )


@dataclass
class CopyCheckSplit:
    """One CopyCheck experiment (paper §III-B1): a suspected set and a surely-unseen set.

    ``pseudo_label``: what the fine-tuning sees (suspected 1, unseen 0). ``truth``: whether
    the target really saw the file (1 seen, 0 unseen), for scoring only.
    """

    suspected: list[str]
    unseen: list[str]
    pseudo_label: dict[str, int] = field(default_factory=dict)
    truth: dict[str, int] = field(default_factory=dict)
    n_unseen_in_suspected: int = 0


def copycheck_experiment(
    seen_files: Iterable[str],
    unseen_files: Iterable[str],
    n_suspected: int = 50,
    n_unseen_in_suspected: int = 10,
    n_unseen: int = 50,
    seed: int = 0,
) -> CopyCheckSplit:
    """Build the paper's setup: draw the Unseen Dataset (``n_unseen`` unseen files) first, then the
    Suspected Seen Dataset from ``n_unseen_in_suspected`` of the remaining unseen files plus
    ``n_suspected - n_unseen_in_suspected`` seen files (CopyCheck §III-B1: 50 suspected books,
    N_unseen in {10, 20, 30, 40}, 50 unseen books). The two sets are disjoint.
    """
    seen = _unique_sorted(seen_files, "the seen file list")
    unseen = _unique_sorted(unseen_files, "the unseen file list")
    both = sorted(set(seen) & set(unseen))
    if both:
        raise MiaError(f"{len(both)} files are listed as both seen and unseen, e.g. {both[0]!r}")
    if n_suspected < 1 or n_unseen < 1:
        raise MiaError(
            f"CopyCheck needs at least 1 suspected and 1 unseen file, got n_suspected={n_suspected}, "
            f"n_unseen={n_unseen}"
        )
    if not 0 <= n_unseen_in_suspected <= n_suspected:
        raise MiaError(
            f"n_unseen_in_suspected must lie between 0 and n_suspected ({n_suspected}), "
            f"not {n_unseen_in_suspected}"
        )
    n_seen_needed = n_suspected - n_unseen_in_suspected
    if len(seen) < n_seen_needed:
        raise MiaError(
            f"CopyCheck needs {n_seen_needed} seen files ({n_suspected} suspected - "
            f"{n_unseen_in_suspected} unseen among them), {len(seen)} available"
        )
    n_unseen_needed = n_unseen + n_unseen_in_suspected
    if len(unseen) < n_unseen_needed:
        raise MiaError(
            f"CopyCheck needs {n_unseen_needed} unseen files ({n_unseen} for the unseen set + "
            f"{n_unseen_in_suspected} among the suspected), {len(unseen)} available"
        )
    rng = np.random.default_rng(seed)
    order = rng.permutation(len(unseen))
    unseen_set = sorted(unseen[i] for i in order[:n_unseen])
    unseen_suspects = [unseen[i] for i in order[n_unseen:n_unseen_needed]]
    seen_suspects = [seen[i] for i in rng.choice(len(seen), size=n_seen_needed, replace=False)]
    suspected = sorted(seen_suspects + unseen_suspects)
    truth = (
        {f: 1 for f in seen_suspects} | {f: 0 for f in unseen_suspects} | {f: 0 for f in unseen_set}
    )
    pseudo = {f: 1 for f in suspected} | {f: 0 for f in unseen_set}
    return CopyCheckSplit(
        suspected=suspected,
        unseen=unseen_set,
        pseudo_label=dict(sorted(pseudo.items())),
        truth=dict(sorted(truth.items())),
        n_unseen_in_suspected=n_unseen_in_suspected,
    )

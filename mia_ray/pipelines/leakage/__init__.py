"""Leakage survey: how much personal information, copyrighted text and benchmark data sits
in a corpus sample (the leakage rate of Kaneko et al., §2).

reference texts → shingle stores (hashed ``span``-word windows, hashed by Ray Data workers,
merged on the driver) → every shard streamed through a pool of scanner actors (PII regexes
and names, store lookups) → one row per document and one per finding, written per shard (a
rerun skips finished shards) → rates per category, type and shard with Wilson intervals →
precision and recall against planted truth when there is one → report.

Package: ``inputs`` (the crawl and its checks), ``scan`` (stores and shards, as stages;
the scanner actor is ``actors/scanner.py``), ``rates`` (Table 2), ``evaluation`` (the model
side: output and detection rates), ``pipeline`` (``run``).
"""

from mia_ray.pipelines.leakage.pipeline import run

__all__ = ["run"]

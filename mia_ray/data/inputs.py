"""A job's documents as its ``data:`` section describes them: read, labelled, sampled per
class and checked (:func:`labelled_documents`), and cut into snippets (:func:`snippets_of`)."""

from __future__ import annotations

from mia_ray.errors import MiaError
from mia_ray.log import note


def labelled_documents(data_cfg):
    """Read documents, attach labels, sample per class, check classes. Returns (ds, labels)."""
    from mia_ray.data.readers import attach_labels, load_manifest, read_documents
    from mia_ray.data.splits import check_classes, sample_per_class

    ds = read_documents(
        data_cfg.path,
        format=data_cfg.format,
        text_field=data_cfg.text_field,
        id_field=data_cfg.id_field,
        label_field=data_cfg.label_field,
        date_field=data_cfg.date_field,
        note=note,
        subset=data_cfg.subset,
        split=data_cfg.split,
    )
    if data_cfg.labels:
        ds = attach_labels(ds, load_manifest(data_cfg.labels), data_cfg.unlabelled, note=note)
    if "label" not in ds.columns():
        raise MiaError(
            f"no membership labels: {data_cfg.path} has no '{data_cfg.label_field}' field and "
            "data.labels (a doc_id -> 0/1 manifest) is not set"
        )
    # read_documents has read and checked every document once already (before any model work).
    ids = ds.select_columns(["doc_id", "label"]).to_pandas()
    labels = dict(zip(ids["doc_id"].astype(str), ids["label"].astype(int), strict=True))
    if data_cfg.max_docs_per_class:
        labels = sample_per_class(labels, data_cfg.max_docs_per_class, data_cfg.seed)
        keep = set(labels)
        ds = ds.filter(lambda r: r["doc_id"] in keep).materialize()
    check_classes(labels, data_cfg.min_docs_per_class)
    return ds, labels


def snippets_of(docs, data_cfg, model_path: str):
    """Documents (a Ray Dataset with doc_id, text) -> snippets as configured in ``data_cfg``
    (lazy); token snippets use ``model_path``'s tokenizer."""
    from mia_ray import storage
    from mia_ray.data.snippets import make_snippets

    return make_snippets(
        docs,
        unit=data_cfg.snippet_unit,
        size=data_cfg.snippet_size,
        min_size=data_cfg.min_snippet_size,
        max_per_doc=data_cfg.max_snippets_per_doc,
        # The snippet tasks load the tokenizer on any node: a driver folder goes by storage.
        tokenizer_path=storage.stage(model_path) if data_cfg.snippet_unit == "tokens" else None,
    )

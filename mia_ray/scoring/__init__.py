"""Scoring, the layer below the pipelines: snippets through pools of Scorer actors as
resumable stages (``pools``), every pass an attack reads beyond the target's plain one
(``passes``), and every attack's score per snippet and per document (``attacks``). It takes
the sections it reads (:class:`config.Scoring`), never a pipeline's job config."""

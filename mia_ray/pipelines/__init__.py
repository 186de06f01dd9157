"""Pipelines: wiring of data → actors → features → detectors → report. One file per method."""

"""The validity suite's synthetic worlds (``worlds``): the audit's guarantees measured over
hundreds of worlds with a known truth. A top floor, beside the CLI: it drives the audit's
own steps, so it sits above the pipelines, never below them."""

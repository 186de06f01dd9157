"""MemHunter: how much of a dataset a model reproduces, and did it train on the dataset?

documents → (x, y) pairs of the target dataset (members; split train / test / val by
document) → the hunter trained to write memory-inducing prompts (Algorithm 1: beam search
scored by a pool of TargetLM actors, rejection-sampled prompt pool, LoRA fine-tune as a Ray
task, one checkpoint per iteration; ``training``) → extraction on held-out pairs with k
sampled prompts per pair, timed → Manual and MiniPrompt (GCG) at the same wall-clock budget,
GCG as a plug-in (``extraction``) → the dataset-level tests (``dataset_test``) → report.

Sound where the paper is not (../shared/methods/README.md): the paper's t-test and its rule
"reject H0 if p > alpha" are reported as the paper's. Every model reads the same hunter
prompts on the same pairs, so the tests we stand behind are paired: a one-sided paired t-test
against a model that surely never saw the data, a paired equivalence test (TOST) against the
proxy, and the verdict: the suspect's gain over the reference on the dataset's pairs against
the same gain on pairs of text outside it (the ``nonmember`` split), so that a model that only
follows the hunter's prompts better than the reference is not flagged.

Every cached stage (hunter iterations, extraction, Manual / MiniPrompt / plug-in, the dataset
test's fine-tunes and LCSS values, sweep cells) is keyed on what decides its numbers
(``keys``): the models by content (``models.identity``), the pairs' tokens, the options, the
adapter's bytes.

On a cluster without a shared disk (``mia_ray.storage``): actors load staged models, the
fine-tunes (the hunter's, the dataset test's) train in a temp folder of their node and put the
result into storage, from where the run pulls it into ``--out``; each checkpoint goes to
storage as it is written; a sweep cell (``sweep``) runs on any node with its own workspace,
storage's ``cells/<name>``, and runs again on another node if its node dies, resuming there.
"""

from mia_ray.pipelines.memhunter.pipeline import run
from mia_ray.pipelines.memhunter.single import run_one

__all__ = ["run", "run_one"]

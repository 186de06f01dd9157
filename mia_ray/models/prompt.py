"""CopyCheck's "0 or 1" prompt: encode a snippet into an instruction, read p("1") from two logits.

The classifier is the causal LM itself: after the prompt, the logits of the answer tokens
"0" and "1" are kept and softmaxed (CopyCheck §IV-B, following BLoB's pruning), so
p(1) = softmax([z_0, z_1])[1]. The same encoder serves fine-tuning and sampling, so the
model is asked exactly what it was trained on.
"""

from __future__ import annotations

from mia_ray.errors import MiaError

# The snippet opens the prompt, where a pretraining document opens a context, so the model
# meets the text the way it met it in training; the question follows it.
DEFAULT_TEMPLATE = (
    "{text}\n\nQuestion: was the text above part of your training data? "
    "Answer 1 for yes, 0 for no.\nAnswer:"
)


class PromptEncoder:
    """Token ids for ``template`` around a snippet, cropped so the whole prompt fits.

    The answer tokens are whatever the tokenizer makes of ``template + " 0"`` and ``+ " 1"``
    at the end (e.g. " 0" in GPT-2's BPE, "0" after a separate space in SmolLM2's), so the
    prompt ends exactly where the answer token starts. The snippet is cropped (its tail
    dropped), never the instruction.
    """

    def __init__(self, tokenizer, template: str = DEFAULT_TEMPLATE, max_length: int = 300):
        if template.count("{text}") != 1:
            raise MiaError("the CopyCheck prompt template must contain {text} exactly once")
        head, tail = template.split("{text}")
        # "Text: {text}" must tokenize like the whole string, where BPE glues the space to the
        # snippet's first word: the space moves from the instruction to the snippet.
        self.lead = " " if head.endswith(" ") else ""
        head = head.rstrip(" ") if self.lead else head
        enc = lambda s: tokenizer.encode(s, add_special_tokens=False)  # noqa: E731
        with0, with1 = enc(tail + " 0"), enc(tail + " 1")
        if with0[:-1] != with1[:-1] or with0[-1] == with1[-1]:
            raise MiaError(
                "the tokenizer does not end the prompt with one answer token for '0' and one "
                "for '1'; change the template's ending"
            )
        self.head = enc(head)
        self.tail = with0[:-1]
        self.answer_ids = [with0[-1], with1[-1]]
        bos = tokenizer.bos_token_id
        # Models trained with a BOS token (Llama family) expect it first; GPT-2 style does not.
        self.prefix = [bos] if bos is not None and bos != tokenizer.eos_token_id else []
        self.budget = max_length - len(self.prefix) - len(self.head) - len(self.tail)
        if self.budget < 8:
            raise MiaError(
                f"max_length {max_length} leaves {self.budget} tokens for the snippet after the "
                "prompt; raise it or shorten the template"
            )
        self.tokenizer = tokenizer
        self.pad_id = tokenizer.pad_token_id
        if self.pad_id is None:
            self.pad_id = tokenizer.eos_token_id if tokenizer.eos_token_id is not None else 0

    def encode(self, texts: list[str]) -> list[list[int]]:
        bodies = self.tokenizer(
            [self.lead + t.lstrip() if self.lead else t for t in texts], add_special_tokens=False
        )["input_ids"]
        return [self.prefix + self.head + b[: self.budget] + self.tail for b in bodies]

    def collate(self, seqs: list[list[int]]):
        """Left-pad: the answer position is the last one in every row. Returns tensors
        ``input_ids``, ``attention_mask``, ``position_ids`` of shape (B, T)."""
        import torch

        width = max(len(s) for s in seqs)
        ids = torch.full((len(seqs), width), self.pad_id, dtype=torch.long)
        mask = torch.zeros((len(seqs), width), dtype=torch.long)
        for i, s in enumerate(seqs):
            ids[i, width - len(s) :] = torch.tensor(s, dtype=torch.long)
            mask[i, width - len(s) :] = 1
        pos = (mask.cumsum(-1) - 1).clamp(min=0)
        return {"input_ids": ids, "attention_mask": mask, "position_ids": pos}


def answer_logits(model, batch, answer_ids: list[int]):
    """Logits of the two answer tokens at the last position: (B, 2) = [z_"0", z_"1"]."""
    out = model(
        input_ids=batch["input_ids"],
        attention_mask=batch["attention_mask"],
        position_ids=batch["position_ids"],
        logits_to_keep=1,
    )
    return out.logits[:, -1, answer_ids].float()


# CopyCheck's black-box variant (§V-E): N = 10 differently worded questions, answered 0 or 1.
# The snippet comes first in most, as in DEFAULT_TEMPLATE; each ends where the answer starts.
BLACKBOX_PROMPTS = (
    "{text}\n\nHave you seen the text above before? Answer 1 for yes, 0 for no.\nAnswer:",
    "{text}\n\nWas this passage part of your training data? Reply 1 (yes) or 0 (no).\nReply:",
    "Text: {text}\nDid you read this text during training? 1 = yes, 0 = no.\nAnswer:",
    "{text}\n\nIs this text familiar to you? Answer 1 if it is, 0 if it is not.\nAnswer:",
    "Passage: {text}\n\nHave you met this passage before? Say 1 for yes or 0 for no.\nAnswer:",
    "{text}\n\nQuestion: did this text appear in the data you were trained on? 1 means yes, "
    "0 means no.\nAnswer:",
    "Consider the following text.\n{text}\nHave you seen it before (1) or not (0)?\nAnswer:",
    "{text}\n\nDo you recognise this text from your training? Answer 0 for no and 1 for yes."
    "\nAnswer:",
    "Here is a snippet: {text}\nWas it in your training set? Output 1 if yes, 0 if no.\nOutput:",
    "{text}\n\nHave you been trained on this exact text? Respond 1 for yes, 0 for no.\nResponse:",
)


def blackbox_p1(lp0: float, lp1: float) -> float:
    """p("1") from the log-probs of the answers " 0" and " 1": the softmax over the two,
    as the white-box sampler takes it over their logits."""
    m = max(lp0, lp1)
    import math

    e0, e1 = math.exp(lp0 - m), math.exp(lp1 - m)
    return e1 / (e0 + e1)

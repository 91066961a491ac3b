"""Word segmentation: units keep their leading space and punctuation, newlines and lone operators are
units of their own, CJK is split by character, and the units always concatenate back to the text."""
import random

from adafuse.words import count_words, is_cjk, split_words, word_end


def test_words_keep_leading_space_and_punctuation():
    assert split_words("She has 18 apples.") == ["She", " has", " 18", " apples."]
    assert split_words(" Natalia sold 48/2 = 24 clips in May.") == [
        " Natalia", " sold", " 48/2", " =", " 24", " clips", " in", " May."]


def test_lone_operators_are_units():
    assert split_words("16*16 = 256") == ["16*16", " =", " 256"]
    assert split_words(" - 3 + 4") == [" -", " 3", " +", " 4"]


def test_newlines_are_never_lost():
    text = "a\n\nb c\n  d\r\n"
    units = split_words(text)
    assert units == ["a", "\n\n", "b", " c", "\n", "  d", "\r\n"]
    assert "".join(units) == text


def test_cjk_by_character():
    assert split_words("我爱你 ok。") == ["我", "爱", "你", " ok", "。"]
    assert is_cjk("の") and not is_cjk("a")


def test_word_end_needs_the_next_unit_to_start():
    assert word_end(" apples") is None
    assert word_end(" apples", final=True) == 7
    assert word_end(" apples ") == 7
    assert word_end(" 18.\n") == 4
    assert word_end("\n\n") is None and word_end("\n\nQ") == 2
    assert word_end("   ") is None and word_end("") is None
    assert word_end("中文") == 1


def test_concatenation_roundtrip_random():
    rng = random.Random(0)
    alphabet = "ab =+-.\n\t 中\r1"
    for _ in range(500):
        text = "".join(rng.choice(alphabet) for _ in range(rng.randint(0, 30)))
        assert "".join(split_words(text)) == text
    assert count_words("a\n\nb c") == 3

"""Tests for trials.prompts: the benchmark prompt catalogue and workload selection."""

import difflib
import itertools

import pytest

from trials.prompts import (
    MAX_PROMPT_CHARS,
    MIN_PROMPT_CHARS,
    PROMPT_SETS,
    PROMPT_TYPES,
    PROMPTS,
    workload_prompts,
)

ALL = [p for t in PROMPT_TYPES for p in PROMPTS[t]]


def _tail_4gram_copy_share(text: str, tail_chars: int = 100) -> float:
    """Share of the character 4-grams of the last *tail_chars* chars that occur earlier."""
    head, tail = text[:-tail_chars], text[-tail_chars:]
    grams = [tail[i : i + 4] for i in range(len(tail) - 3)]
    return sum(g in head for g in grams) / len(grams)


def _suffix_words_seen_before(text: str, n: int = 3) -> bool:
    """Whether the last *n* words already occur earlier (what prompt lookup needs to draft)."""
    words = text.split()
    return " ".join(words[-n:]) in " ".join(words[:-n])


def _mean(xs):
    return sum(xs) / len(xs)


def test_every_set_is_one_type_or_all_of_them_in_order():
    assert tuple(PROMPT_SETS["mixed"]) == PROMPT_TYPES
    for t in PROMPT_TYPES:
        assert tuple(PROMPT_SETS[t]) == (t,)


def test_at_least_ten_prompts_per_type():
    assert set(PROMPTS) == set(PROMPT_TYPES)
    for t in PROMPT_TYPES:
        assert len(PROMPTS[t]) >= 10, t


def test_ids_unique_and_well_formed():
    ids = [p.id for p in ALL]
    assert len(ids) == len(set(ids))
    for t in PROMPT_TYPES:
        for i, p in enumerate(PROMPTS[t]):
            assert p.type == t
            assert p.id == f"{t}-{i:02d}"


def test_texts_unique():
    texts = [p.text for p in ALL]
    assert len(texts) == len(set(texts))


def test_lengths_within_range():
    for p in ALL:
        assert MIN_PROMPT_CHARS <= len(p.text) <= MAX_PROMPT_CHARS, (p.id, len(p.text))


def test_asking_for_more_prompts_than_exist_gives_them_all():
    assert len(workload_prompts("mixed", per_type=10_000)) == len(ALL)


def test_code_prompts_end_mid_body_and_differ():
    for p in PROMPTS["code"]:
        assert p.text.lstrip().startswith(("def ", "class ")), p.id
        last_lines = p.text.rstrip().splitlines()
        # stops after a block opener or inside an indented body, never at column 0
        assert p.text.endswith(" ") or last_lines[-1].rstrip().endswith(":"), p.id
        # a plausible Python prefix: completing the open block with `pass` compiles
        compile(p.text + "pass\n", p.id, "exec")
    for a, b in itertools.combinations(PROMPTS["code"], 2):
        assert a.text != b.text
        assert difflib.SequenceMatcher(None, a.text, b.text).ratio() < 0.5, (a.id, b.id)


def test_prose_prompts_end_mid_sentence():
    for p in PROMPTS["prose"]:
        assert p.text[-1].isalpha(), p.id
        assert not p.text.rstrip().endswith((".", "!", "?")), p.id
        assert p.text.count(". ") >= 1, p.id  # a paragraph, not a single fragment


def test_structured_prompts_have_several_records():
    for p in PROMPTS["structured"]:
        lines = [ln for ln in p.text.splitlines() if ln.strip()]
        assert len(lines) >= 5, p.id
        assert not p.text.endswith("\n"), p.id  # ends mid-record


def test_repetitive_prompts_are_copy_heavy():
    shares = {p.id: _tail_4gram_copy_share(p.text) for p in PROMPTS["repetitive"]}
    for pid, share in shares.items():
        assert share >= 0.65, (pid, share)
    assert _mean(list(shares.values())) >= 0.85
    for p in PROMPTS["repetitive"]:
        assert _suffix_words_seen_before(p.text), p.id


def test_repetitive_distinct_from_other_types():
    def mean_share(t):
        return _mean([_tail_4gram_copy_share(p.text) for p in PROMPTS[t]])

    rep = mean_share("repetitive")
    for t in ("code", "prose", "structured"):
        assert rep - mean_share(t) >= 0.25, t
    # n-gram lookup can draft from the final words of code and prose prompts only rarely
    for t in ("code", "prose"):
        assert not any(_suffix_words_seen_before(p.text) for p in PROMPTS[t]), t


def test_mixed_workload_interleaves_by_type():
    w = workload_prompts("mixed")
    n = min(len(PROMPTS[t]) for t in PROMPT_TYPES)
    head = [p.id for p in w[: 4 * n]]
    expected = [f"{t}-{i:02d}" for i in range(n) for t in PROMPT_TYPES]
    assert head == expected
    assert [p.id for p in w[:5]] == [
        "code-00",
        "prose-00",
        "structured-00",
        "repetitive-00",
        "code-01",
    ]
    assert sorted(p.id for p in w) == sorted(p.id for p in ALL)


def test_per_type_truncation():
    w = workload_prompts("mixed", per_type=2)
    assert [p.id for p in w] == [
        "code-00",
        "prose-00",
        "structured-00",
        "repetitive-00",
        "code-01",
        "prose-01",
        "structured-01",
        "repetitive-01",
    ]
    w1 = workload_prompts("mixed", per_type=1)
    assert [p.type for p in w1] == list(PROMPT_TYPES)
    big = workload_prompts("mixed", per_type=10_000)
    assert len(big) == len(ALL)


@pytest.mark.parametrize("t", PROMPT_TYPES)
def test_single_type_sets(t):
    assert list(workload_prompts(t)) == list(PROMPTS[t])
    assert [p.id for p in workload_prompts(t, per_type=3)] == [f"{t}-{i:02d}" for i in range(3)]


def test_workload_returns_fresh_list():
    a = workload_prompts("code")
    a.clear()
    assert len(workload_prompts("code")) == len(PROMPTS["code"])


def test_unknown_set_error_names_valid_sets():
    with pytest.raises(ValueError) as exc:
        workload_prompts("nope")
    msg = str(exc.value)
    assert "nope" in msg
    for name in PROMPT_SETS:
        assert name in msg


@pytest.mark.parametrize("bad", [0, -1])
def test_per_type_below_one_rejected(bad):
    with pytest.raises(ValueError, match="per_type"):
        workload_prompts("mixed", per_type=bad)

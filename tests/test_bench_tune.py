"""bench.tune's leave-one-conversation-out: a flat optimum beats a sharp one, and each fold is
scored on the conversation it did not choose on."""

from __future__ import annotations

import numpy as np

from bench.tune import Asked, Family, first_wanted, leave_one_out, zscore


def _asked(conversation: str, wanted: int) -> Asked:
    size = 4
    flags = np.zeros(size, dtype=bool)
    flags[wanted] = True
    empty = np.zeros(size)
    return Asked(conversation, "single-hop", flags, [], empty, empty, empty, flags)


def test_a_flat_optimum_is_chosen_over_a_sharp_one():
    # Setting 5 finds every question, 4 and 6 none: a sharp peak; 1 to 3 find most: a plateau.
    found = {1.0: 0.6, 2.0: 0.8, 3.0: 0.75, 4.0: 0.0, 5.0: 1.0, 6.0: 0.0}
    asked = [_asked(f"c{n % 5}", 0) for n in range(40)]
    position_of = {id(a): n for n, a in enumerate(asked)}

    def scores(a: Asked, setting: dict[str, float]) -> np.ndarray:
        position = position_of[id(a)]
        hit = position % 20 < 20 * found[setting["x"]]
        return np.array([1.0, 0.0, 0.0, 0.0]) if hit else np.array([0.0, 1.0, 1.0, 1.0])

    lines = leave_one_out(Family("toy", {"x": list(found)}, scores), asked)
    assert all("chose x=2" in line for line in lines[1:6])
    assert lines[7].startswith("  on all five: x=2")


def test_ties_rank_by_key_and_an_absent_entry_scores_as_the_lists_last():
    assert first_wanted(np.array([1.0, 1.0, 0.5]), np.array([False, True, False])) == 2
    assert first_wanted(np.array([-np.inf, 1.0]), np.array([True, False])) is None
    keyword = np.array([3.0, 1.0, -np.inf, -np.inf])  # two candidates: not cut at depth 3
    meaning = np.array([0.1, 0.2, 0.3, 0.4])
    fused = zscore(keyword, meaning, 0.5, 3)
    # meaning's list (depth 3) is cut: entry 0, absent from it, is given its last cosine, 0.2
    z_meaning = (np.array([0.2, 0.2, 0.3, 0.4]) - 0.3) / np.std([0.4, 0.3, 0.2])
    z_keyword = (np.array([3.0, 1.0, 0.0, 0.0]) - 2.0) / 1.0
    assert np.allclose(fused, 0.5 * z_keyword + 0.5 * z_meaning)

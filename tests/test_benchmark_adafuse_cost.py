"""benchmarks/adafuse_cost.py's ratios: the decode ratio to the slowest member alone, its split by
model, and the batch-1 floor a perfect free drafter on the lead's confident runs would leave."""
from __future__ import annotations

import sys
from pathlib import Path

import pytest

REPO = Path(__file__).resolve().parents[1]
sys.path.insert(0, str(REPO / "benchmarks"))

import adafuse_cost  # noqa: E402


def _rows():
    lead = {"run": "lead", "lead": "lead", "words": 100, "s_per_word": 0.30, "decode_s_per_word": 0.25,
            "fwd_per_word": {"lead": 1.6}, "forward_s_per_word": {"lead": 0.24}, "other_s_per_word": 0.01}
    small = {"run": "small", "lead": "small", "words": 120, "s_per_word": 0.12, "decode_s_per_word": 0.10,
             "fwd_per_word": {"small": 1.5}, "forward_s_per_word": {"small": 0.09}, "other_s_per_word": 0.01}
    ens = {"run": "ens", "lead": "lead", "words": 80, "s_per_word": 0.55, "decode_s_per_word": 0.50,
           "fwd_per_word": {"lead": 1.5, "small": 1.0}, "forward_s_per_word": {"lead": 0.30, "small": 0.15},
           "other_s_per_word": 0.05, "confident_s": 16.0, "confident_runs": 20}
    return [lead, small, ens]


def test_floor_replaces_the_confident_runs_by_one_lead_forward_each():
    rows = _rows()
    adafuse_cost.add_ratios(rows, {"lead", "small"}, floor=True)
    ens = rows[2]
    assert ens["decode_ratio_to_slowest_alone"] == pytest.approx(0.50 / 0.25)
    assert ens["decode_shares"] == pytest.approx({"lead": 1.2, "small": 0.6, "other": 0.2})
    one_forward = 0.24 / 1.6  # the lead's mean decode forward alone
    kept = 0.50 * 80 - 16.0 + 20 * one_forward  # decode time without the runs, plus one forward per run
    assert ens["floor_ratio"] == pytest.approx(kept / 80 / 0.25, abs=1e-3)
    assert "floor_ratio" not in rows[0] and "floor_ratio" not in rows[1]


def test_no_floor_beyond_batch_1_or_without_the_lead_alone():
    rows = _rows()
    adafuse_cost.add_ratios(rows, {"lead", "small"}, floor=False)
    assert "floor_ratio" not in rows[2]
    rows = _rows()
    rows[2]["lead"] = "another"
    adafuse_cost.add_ratios(rows, {"lead", "small"}, floor=True)
    assert "floor_ratio" not in rows[2] and "decode_ratio_to_slowest_alone" in rows[2]

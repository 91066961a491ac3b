"""The committed experiments (`experiments/`): every path the docs name exists, and the published
figures recompute from the moved records (a sample of them, re-read by their paths)."""
from __future__ import annotations

import json
import re
from pathlib import Path

import pytest

from eval.task import get_task

REPO = Path(__file__).resolve().parents[1]
DOCS = [REPO / "README.md", *sorted((REPO / "docs").rglob("*.md")), *sorted((REPO / "experiments").glob("*/*.md"))]


def test_every_experiment_path_the_docs_name_exists():
    missing = []
    for doc in DOCS:
        for path in re.findall(r"(?<![\w./])experiments/[\w./*-]+", doc.read_text(encoding="utf-8")):
            path = path.rstrip(".,:)")
            if "*" in path:
                if not list(REPO.glob(path)):
                    missing.append((doc.name, path))
            elif not (REPO / path).exists() and not (REPO / path.split(" ")[0]).exists():
                missing.append((doc.name, path))
    assert not missing, missing


@pytest.mark.parametrize("folder, task", [
    ("experiments/table_views_gsm8k_final/view-vote-weighted/gsm8k", "gsm8k"),
    ("experiments/table_views_gsm8k_final/view-vote-weighted/gsm8k/members/qwen2.5-coder-1.5b", "gsm8k"),
    ("experiments/table_nq/qwen2.5-coder-1.5b/nq_open", "nq_open"),
    ("experiments/table_views_wmt_rerank/rerank-8/wmt22_de_en", "wmt22_de_en"),
])
def test_published_metrics_recompute_from_the_moved_records(folder, task):
    base = REPO / folder
    metrics = json.loads((base / "metrics.json").read_text())
    records = [json.loads(line) for line in (base / "predictions.jsonl").read_text().splitlines()]
    values = get_task(task).values(records)
    assert len(records) == metrics["n"]
    assert values[metrics["primary_metric"]] == pytest.approx(metrics["score"])

"""Named problem sources: spec parsing, rows merged per question, local files and a mocked hub."""

from __future__ import annotations

import json
from dataclasses import replace

import datasets
import pytest

from coscale.datamodules import ProblemDataModule
from coscale.tasks.benchmarks import (
    SOURCES,
    BenchmarkSource,
    group_rows,
    load_benchmark,
    parse_source,
    source_rows,
)

OMR_ROWS = [  # OpenMathReasoning-style: one row per generated solution
    {"problem": "How many ways?", "expected_answer": "6", "generated_solution": "A \\boxed{6}",
     "problem_type": "has_answer_extracted", "problem_source": "aops"},
    {"problem": "How  many\nways?", "expected_answer": "6", "generated_solution": "B \\boxed{6}",
     "problem_type": "has_answer_extracted", "problem_source": "aops"},
    {"problem": "Find x.", "expected_answer": "2", "generated_solution": "C \\boxed{2}",
     "problem_type": "converted_proof", "problem_source": "aops"},
    {"problem": "Find y.", "expected_answer": "3", "generated_solution": "D \\boxed{3}",
     "problem_type": "has_answer_extracted", "problem_source": "aops"},
    {"problem": "How many ways?", "expected_answer": "7", "generated_solution": "A \\boxed{6}",
     "problem_type": "has_answer_extracted", "problem_source": "aops"},
    {"problem": "Find z.", "expected_answer": "4", "generated_solution": "E",
     "problem_type": "has_answer_extracted", "problem_source": "aops"},
]  # fmt: skip


def test_specs_pick_a_named_source_and_override_settings():
    math500 = parse_source("math500")
    assert (math500.path, math500.split, math500.question, math500.id) == (
        "HuggingFaceH4/MATH-500", "test", "problem", "unique_id"
    )  # fmt: skip
    omr = parse_source("source:openmathreasoning?limit=2&max_rows=100&streaming=false&split=tir")
    assert (omr.limit, omr.max_rows, omr.streaming, omr.split) == (2, 100, False, "tir")
    assert omr.where == (("problem_type", ("has_answer_extracted",)),)
    custom = parse_source("mine?path=data/t.jsonl&question=q&answer=a&where=level:4|5&id=")
    assert (custom.name, custom.path, custom.question, custom.answer, custom.id) == (
        "mine", "data/t.jsonl", "q", "a", None
    )  # fmt: skip
    assert custom.where == (("level", ("4", "5")),)
    assert parse_source(custom) is custom
    assert all(key == source.name for key, source in SOURCES.items())


def test_bad_specs_name_the_problem():
    with pytest.raises(ValueError, match=r"unknown problem source 'aime'.*'math500'"):
        parse_source("aime")
    with pytest.raises(ValueError, match=r"unknown settings \['colour'\]"):
        parse_source("math500?colour=red")
    with pytest.raises(ValueError, match="limit must be an int >= 1"):
        parse_source("math500?limit=0")


@pytest.fixture
def omr(tmp_path) -> BenchmarkSource:
    """The OpenMathReasoning source (limit 2) reading `OMR_ROWS` from a local JSON file."""
    path = tmp_path / "omr.json"
    path.write_text(json.dumps(OMR_ROWS))
    return replace(parse_source("openmathreasoning?limit=2"), path=str(path))


def test_rows_of_one_question_become_one_problem_with_all_solutions(omr):
    with pytest.warns(UserWarning, match="1 rows disagree"):
        rows = source_rows(omr)
    assert [r["question"] for r in rows] == ["How many ways?", "Find y."]  # proof row dropped
    first = rows[0]
    assert first["solutions"] == ["A \\boxed{6}", "B \\boxed{6}"]  # duplicate A dropped
    assert first["answer"] == "6" and first["problem_source"] == "aops"  # first answer kept
    assert first["id"].startswith("openmathreasoning-") and len(first["id"]) == 18 + 12
    again, stats = group_rows(OMR_ROWS, omr)
    assert [r["id"] for r in again] == [r["id"] for r in rows]  # ids are stable
    # "Find z." is past the limit; the 5th row, of "How many ways?", still merges
    assert (stats.rows, stats.kept_rows, stats.problems, stats.solutions) == (6, 4, 2, 3)
    assert stats.answer_conflicts == 1


def test_hub_sources_go_through_datasets_load_dataset(monkeypatch):
    calls = []

    def fake_load_dataset(path, name=None, split=None, streaming=False):
        calls.append((path, name, split, streaming))
        return iter(OMR_ROWS)

    monkeypatch.setattr(datasets, "load_dataset", fake_load_dataset)
    problems = load_benchmark("openmathreasoning?max_rows=4")
    assert calls == [("nvidia/OpenMathReasoning", None, "cot", True)]
    assert [(p.question, p.answer, len(p.solutions)) for p in problems] == [
        ("How many ways?", "6", 2), ("Find y.", "3", 1)
    ]  # fmt: skip  # max_rows=4: the 5th and 6th rows are never read
    calls.clear()
    with pytest.raises(ValueError, match=r"fields \['answer'\] are not in its rows"):
        load_benchmark("olymmath-en-easy")  # these rows have expected_answer, not answer
    assert calls == [("RUC-AIBOX/OlymMATH", "en-easy", "test", False)]


def test_offline_hub_failure_says_how_to_use_a_local_copy(monkeypatch):
    def offline(*args, **kwargs):
        raise ConnectionError("no network")

    monkeypatch.setattr(datasets, "load_dataset", offline)
    with pytest.raises(ValueError, match=r"could not load problem source 'amc'.*amc\?path="):
        load_benchmark("amc")


def test_local_jsonl_parquet_and_saved_dataset(tmp_path):
    rows = [
        {"problem": "1+1?", "answer": 2, "unique_id": "a"},
        {"problem": "2+2?", "answer": "4", "unique_id": "b"},
        {"problem": "3+3?", "answer": None, "unique_id": "c"},  # no answer: skipped, with a warning
    ]
    jsonl = tmp_path / "m.jsonl"
    jsonl.write_text("\n".join(json.dumps(r) for r in rows))
    with pytest.warns(UserWarning, match="skipped 1 bad rows"):
        problems = load_benchmark(f"math500?path={jsonl}")
    assert [(p.id, p.question, p.answer) for p in problems] == [
        ("a", "1+1?", "2"),
        ("b", "2+2?", "4"),
    ]
    good = [{**r, "answer": str(r["answer"])} for r in rows[:2]]  # one type per column
    datasets.Dataset.from_list(good).to_parquet(str(tmp_path / "m.parquet"))
    from_parquet = load_benchmark(f"math500?path={tmp_path / 'm.parquet'}")
    datasets.DatasetDict({"test": datasets.Dataset.from_list(good)}).save_to_disk(
        str(tmp_path / "d")
    )
    from_disk = load_benchmark(f"math500?path={tmp_path / 'd'}")
    assert [p.id for p in from_parquet] == [p.id for p in from_disk] == ["a", "b"]


def test_source_rows_feed_the_datamodule_with_their_solutions(omr):
    with pytest.warns(UserWarning):
        rows = source_rows(omr)
    dm = ProblemDataModule(train=rows, bank_solutions=0, curriculum={"solutions_per_round": 4})
    dm.load()
    # the data set's own solutions go to the bank first
    assert dm.curriculum.scale_solutions() == 3
    assert sorted(dm.curriculum.bank.count(pid) for pid in dm.problems) == [1, 2]
    loaded = ProblemDataModule(train=rows)  # bank_solutions=None: all of them at load
    loaded.load()
    assert sorted(loaded.curriculum.bank.count(pid) for pid in loaded.problems) == [1, 2]


def test_one_source_split_into_training_and_validation_sides(tmp_path):
    """``side=train`` and ``side=val`` of one file: disjoint problems, every problem on one
    side, about one in ten on validation, each row's solutions kept with its problem."""
    from coscale.tasks.sides import side_of

    rows = [
        {"problem": f"What is {a} times {a + 3}?", "answer": str(a * (a + 3)), "solution": f"s{a}"}
        for a in range(300)
    ]
    path = tmp_path / "mine.jsonl"
    path.write_text("".join(json.dumps(r) + "\n" for r in rows))
    spec = f"source:mine?path={path}&solution=solution"
    train, val = (ProblemDataModule(train=f"{spec}&side={side}") for side in ("train", "val"))
    for dm in (train, val):
        dm.load()
    train_q = {p.question for p in train.problems.values()}
    val_q = {p.question for p in val.problems.values()}
    assert not train_q & val_q and len(train_q) + len(val_q) == 300
    assert 15 <= len(val_q) <= 45
    assert all(side_of(q, with_test=False) == "val" for q in val_q)
    assert all(len(p.solutions) == 1 for p in val.problems.values())
    with pytest.raises(ValueError, match=r"side must be train or val in .*got 'test'"):
        parse_source(f"{spec}&side=test")

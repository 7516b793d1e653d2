"""Tests for coscale.tasks: the Problem record and load_problems on every kind of source."""

from __future__ import annotations

import json
import math
import re
import warnings

import pytest

from coscale.tasks import BadRow, FieldSettings, LoadResult, Problem, as_field_map, load_problems
from coscale.tasks.benchmarks import load_benchmark

# One JSONL file with every kind of bad row; the line numbers are the ones an editor shows.
JSONL_LINES = [
    {"id": "a", "question": "1+1?", "answer": "2", "solutions": ["1+1=2, so \\boxed{2}"]},  # 1
    "",  # 2: blank, ignored (not a bad row)
    {"id": "x", "question": ["a", "list"], "answer": "1"},  # 3: question of the wrong type
    {"id": "b", "question": "   ", "answer": "1"},  # 4: empty question
    {"id": "c", "question": "q", "answer": ""},  # 5: empty answer
    {"id": "d", "question": "q"},  # 6: missing answer
    {"id": "e", "question": 5, "answer": "1"},  # 7: question of the wrong type
    {"id": "f", "question": "q", "answer": True},  # 8: bool answer
    {"id": "g", "question": "q", "answer": "1", "solutions": 7},  # 9 (one str is one solution)
    {"id": "h", "question": "q", "answer": "1", "solutions": ["ok", ""]},  # 10: empty solution
    {"id": "a", "question": "again", "answer": "3"},  # 11: duplicate id
    [1, 2],  # 12: not an object
    {"question": "no id", "answer": 7, "level": 3},  # 13: good, generated id, int answer
    {"id": 5, "question": "int id", "answer": 2.5},  # 14: good, int id, float answer
    {"id": 1.5, "question": "q", "answer": "1"},  # 15: id of the wrong type
    {"id": "n", "question": "q", "answer": math.nan},  # 16: not a finite number
]
BAD_REASONS = {
    4: "empty question (field 'question')",
    5: "empty answer (field 'answer')",
    6: "missing answer (field 'answer')",
    7: "question (field 'question') must be str, got int",
    8: "answer (field 'answer') must be str or int or float, got bool",
    9: "solutions (field 'solutions') must be a str, a list of str or one assistant message, "
    "got int",
    10: "solutions (field 'solutions') must be a list of non-empty str",
    12: "row must be an object, got list",
    15: "id (field 'id') must be str or int, got float",
    16: "answer (field 'answer') must be a finite number, got nan",
}


def write_jsonl(path, lines):
    text = [line if isinstance(line, str) else json.dumps(line) for line in lines]
    path.write_text("\n".join(text) + "\n", encoding="utf-8")
    return path


@pytest.fixture
def jsonl(tmp_path):
    return write_jsonl(tmp_path / "train.jsonl", JSONL_LINES)


def load_quietly(*args, **kwargs) -> LoadResult:
    with warnings.catch_warnings():
        warnings.simplefilter("ignore")
        return load_problems(*args, **kwargs)


def test_jsonl_good_rows_and_every_bad_row_with_its_line(jsonl):
    with pytest.warns(UserWarning, match=r"skipped 12 bad rows of .*train\.jsonl") as record:
        result = load_problems(jsonl)
    assert [p.id for p in result.problems] == ["a", "train-12", "5"]  # train-12: line 13
    first, generated, numeric = result.problems
    assert first == Problem("a", "1+1?", "2", ("1+1=2, so \\boxed{2}",), {})
    assert (generated.answer, generated.solutions, generated.meta) == ("7", (), {"level": 3})
    assert numeric.answer == "2.5"
    wheres = [bad.where for bad in result.bad_rows]
    assert wheres == [f"{jsonl}:{n}" for n in (3, 4, 5, 6, 7, 8, 9, 10, 11, 12, 15, 16)]
    reasons = {int(bad.where.rsplit(":", 1)[1]): bad.reason for bad in result.bad_rows}
    assert {n: reasons[n] for n in BAD_REASONS} == BAD_REASONS
    assert reasons[3].startswith("question (field 'question') must be str or a list of")
    assert reasons[11] == f"duplicate id 'a' (first at {jsonl}:1)"
    # One warning, quoting the first 5 bad rows with file:line and counting the rest.
    assert len(record) == 1
    message = str(record[0].message)
    assert f"{jsonl}:4: empty question (field 'question')" in message
    assert f"{jsonl}:7: " in message and f"{jsonl}:8: " not in message
    assert "... and 7 more" in message


def test_raise_mode_collects_every_bad_row(jsonl):
    with pytest.raises(ValueError, match="on_bad_row") as info:
        load_problems(jsonl, on_bad_row="raise")
    message = str(info.value)
    assert message.startswith(f"12 bad rows in {jsonl}")
    for line, reason in BAD_REASONS.items():
        assert f"{jsonl}:{line}: {reason}" in message
    assert f"{jsonl}:11: duplicate id 'a'" in message


def test_clean_source_warns_nothing_in_either_mode(tmp_path):
    path = write_jsonl(tmp_path / "ok.json", [{"question": "q", "answer": "1"}])
    with warnings.catch_warnings():
        warnings.simplefilter("error")
        for mode in ("skip", "raise"):
            result = load_problems(path, on_bad_row=mode)
            assert [p.id for p in result.problems] == ["ok-0"] and result.bad_rows == []


def test_parquet_with_openmath_style_fields(tmp_path):
    pa, pq = pytest.importorskip("pyarrow"), pytest.importorskip("pyarrow.parquet")
    table = pa.table(
        {
            "problem": ["What is 6*7?", "Half of 1?", "No answer here", "Sum 1..3?"],
            "expected_answer": ["42", "0.5", None, "6"],
            "generated_solutions": [["6*7=42"], None, [], ["1+2+3=6", "3*4/2=6"]],
            "problem_type": ["arith", "arith", "arith", "series"],
        }
    )
    path = tmp_path / "openmath.parquet"
    pq.write_table(table, path)
    fields = FieldSettings("problem", "expected_answer", "generated_solutions", id=None)
    result = load_quietly(path, fields=fields)
    assert [p.id for p in result.problems] == ["openmath-0", "openmath-1", "openmath-3"]
    assert result.problems[0].solutions == ("6*7=42",)
    assert result.problems[1].solutions == ()  # null list: no solutions, not a bad row
    # the answer's column stays in meta by its own name (reward functions get it so, as in TRL)
    meta = {"expected_answer": "6", "problem_type": "series"}
    assert result.problems[2] == Problem(
        "openmath-3", "Sum 1..3?", "6", ("1+2+3=6", "3*4/2=6"), meta
    )
    assert result.bad_rows == [BadRow(f"{path} row 2", "missing answer (field 'expected_answer')")]
    # The default FieldSettings does not fit: raised from the schema, before any row is read.
    with pytest.raises(ValueError, match=r"fields.question='question' and fields.answer='answer'"):
        load_problems(path)


def test_save_to_disk_directory_picks_the_split(tmp_path):
    datasets = pytest.importorskip("datasets")
    rows = {"question": ["a?", ""], "answer": ["1", "2"]}
    splits = {"train": datasets.Dataset.from_dict(rows), "test": datasets.Dataset.from_dict(rows)}
    datasets.DatasetDict(splits).save_to_disk(str(tmp_path / "dd"))
    result = load_quietly(tmp_path / "dd", split="test")
    assert [p.id for p in result.problems] == ["dd-0"]
    assert result.bad_rows == [
        BadRow(f"{tmp_path / 'dd'}[test] row 1", "empty question (field 'question')")
    ]
    with pytest.raises(ValueError, match=r"split='dev' .*\['train', 'test'\]"):
        load_problems(tmp_path / "dd", split="dev")
    splits["train"].save_to_disk(str(tmp_path / "single"))  # a plain Dataset: split unused
    single = load_quietly(str(tmp_path / "single"), split="whatever")
    assert single.bad_rows[0].where == f"{tmp_path / 'single'} row 1"


def test_in_memory_rows_numbers_as_answers_and_summary():
    rows = [
        {"question": "int", "answer": 42},
        {"question": "float", "answer": 0.25},
        {"question": "neg", "answer": -3},
        {"question": "bool", "answer": False},
        {"question": "dict", "answer": {"x": 1}},
    ]
    result = load_quietly(rows)
    assert [(p.id, p.answer) for p in result.problems] == [
        ("rows-0", "42"),
        ("rows-1", "0.25"),
        ("rows-2", "-3"),
    ]
    assert [str(b.where) for b in result.bad_rows] == ["rows[3]", "rows[4]"]
    assert (
        result.bad_rows[1].reason == "answer (field 'answer') must be str or int or float, got dict"
    )
    assert result.summary() == (
        "3 problems, 2 bad rows from the given rows\n"
        "  rows[3]: answer (field 'answer') must be str or int or float, got bool\n"
        "  rows[4]: answer (field 'answer') must be str or int or float, got dict"
    )


def test_wrong_question_field_raises_at_once_naming_the_mapping(tmp_path):
    path = write_jsonl(tmp_path / "om.jsonl", [{"problem": "p", "expected_answer": "1"}] * 3)
    with pytest.raises(ValueError) as info:
        load_problems(path, fields=FieldSettings(answer="expected_answer"), on_bad_row="raise")
    message = str(info.value)
    assert "fields.question='question'" in message and "fields.answer" not in message
    assert str(path) in message and "['problem', 'expected_answer']" in message
    # Both fields missing are named in one error.
    with pytest.raises(ValueError, match=r"fields.question='question' and fields.answer='answer'"):
        load_problems([{"problem": "p", "expected_answer": "1"}])


def test_limit_keeps_the_first_good_problems_and_stops_reading(jsonl):
    result = load_quietly(jsonl, limit=2)
    assert [p.id for p in result.problems] == ["a", "train-12"]
    assert len(result.bad_rows) == 10  # lines 3..12; lines 15 and 16 were never read
    with pytest.raises(ValueError, match=r"limit must be None or an int >= 1, got 0"):
        load_problems(jsonl, limit=0)


def test_bad_settings_and_offline_hub_name(monkeypatch, jsonl):
    with pytest.raises(ValueError, match=r"on_bad_row must be one of \('skip', 'raise'\)"):
        load_problems(jsonl, on_bad_row="ignore")
    datasets = pytest.importorskip("datasets")

    def offline(*args, **kwargs):
        raise ConnectionError("no network")

    monkeypatch.setattr(datasets, "load_dataset", offline)
    with pytest.raises(ValueError, match=r"source='org/openmath'.*no network.*local path"):
        load_problems("org/openmath")


def test_problem_round_trip_and_hash():
    problem = Problem("p1", "q", "4", ["s1", "s2"], {"level": 2})
    assert problem.solutions == ("s1", "s2")
    assert Problem(**json.loads(json.dumps(problem.to_dict()))) == problem
    # Hashable although meta is a dict (meta is left out of the hash, not out of ==).
    assert len({problem, Problem(**problem.to_dict())}) == 1
    assert problem != Problem("p1", "q", "4", ("s1", "s2"))


# ------------------------------------------------------------ bad input is refused clearly
def test_no_usable_problem_is_an_error_naming_the_source(tmp_path):
    empty = tmp_path / "empty.jsonl"
    empty.write_text("\n\n", encoding="utf-8")
    with pytest.raises(ValueError) as info:
        load_problems(empty)
    assert str(info.value).startswith(f"{empty} holds 0 usable problems (it has no rows)")
    rows = [{"question": "q", "answer": ""}, {"question": " ", "answer": "1"}, [1]]
    all_bad = write_jsonl(tmp_path / "bad.jsonl", rows)
    with warnings.catch_warnings():
        warnings.simplefilter("error")  # the error says it all: no warning first
        with pytest.raises(ValueError) as info:
            load_problems(all_bad)
    head, *listing = str(info.value).splitlines()
    assert head == (
        f"{all_bad} holds 0 usable problems (3 bad rows skipped); check the file or `fields` "
        "(question='question', answer='answer'):"
    )
    assert listing == [
        f"  {all_bad}:1: empty answer (field 'answer')",
        f"  {all_bad}:2: empty question (field 'question')",
        f"  {all_bad}:3: row must be an object, got list",
    ]
    # Rows made from a spec have no path: `name` says where they came from.
    with pytest.raises(ValueError, match=r"^train=builtin:x holds 0 usable problems \(it has"):
        load_problems([], name="train=builtin:x")
    with pytest.raises(ValueError, match=r"^the given rows holds 0 usable problems"):
        load_problems([])
    # Under on_bad_row="raise" the error lists every bad row, as before.
    with pytest.raises(ValueError, match=r"^3 bad rows in .*bad\.jsonl \(on_bad_row='raise'"):
        load_problems(all_bad, on_bad_row="raise")


def test_name_labels_every_message_of_a_source(tmp_path):
    rows = [{"question": "q", "answer": "1"}, {"question": "q2"}]
    result = load_quietly(rows, name="val=builtin:tiers")
    assert result.source == "val=builtin:tiers"
    assert result.summary().startswith("1 problems, 1 bad rows from val=builtin:tiers\n")
    assert result.bad_rows == [BadRow("rows[1]", "missing answer (field 'answer')")]


@pytest.mark.parametrize(
    "name", ["gone.jsonl", "gone.json", "gone.parquet", "gone.csv", "sub/dir/gone", "./gone"]
)
def test_a_missing_local_path_is_one_line_naming_it(tmp_path, monkeypatch, name):
    monkeypatch.chdir(tmp_path)
    with pytest.raises(FileNotFoundError) as info:
        load_problems(name)
    message = str(info.value)
    assert message == (
        f"source={name!r}: no such file or folder (it is a local path, not a HF hub name; "
        f"relative paths start at {tmp_path})"
    )
    assert info.value.__context__ is None  # raised before pyarrow or datasets is called
    absolute = tmp_path / name
    with pytest.raises(FileNotFoundError, match=re.escape(f"source={str(absolute)!r}: no such")):
        load_problems(absolute)


def test_existing_files_and_folders_that_are_not_read(tmp_path):
    csv = tmp_path / "train.csv"
    csv.write_text("question,answer\nq,1\n", encoding="utf-8")
    with pytest.raises(ValueError, match=r"is a \.csv file, which is not read; give a \.jsonl"):
        load_problems(csv)
    not_parquet = tmp_path / "x.parquet"
    not_parquet.write_text("not parquet", encoding="utf-8")
    with pytest.raises(ValueError, match=r"x\.parquet' is not a readable Parquet file"):
        load_problems(not_parquet)
    folder = tmp_path / "folder"
    folder.mkdir()
    pytest.importorskip("datasets")
    with pytest.raises(FileNotFoundError) as info:
        load_problems(folder)
    assert str(info.value).startswith(
        f"source={str(folder)!r} is a folder that Dataset.save_to_disk did not write"
    )
    assert "\n" not in str(info.value) and info.value.__cause__ is None


def test_an_unknown_hub_name_says_it_is_no_local_path_either(monkeypatch):
    datasets = pytest.importorskip("datasets")

    def offline(*args, **kwargs):
        raise ConnectionError("no network")

    monkeypatch.setattr(datasets, "load_dataset", offline)
    with pytest.raises(ValueError, match=r"no local file or folder 'data/train' either"):
        load_problems("data/train")  # a folder that is missing looks like org/name


@pytest.mark.parametrize("on_bad_row", ["skip", "raise"])
def test_a_malformed_line_is_an_error_naming_the_files_line(tmp_path, on_bad_row):
    path = tmp_path / "t.jsonl"
    path.write_text('{"question": "q", "answer": "1"}\n\n{"question": "q2", "answ\n', "utf-8")
    with pytest.raises(ValueError) as info:
        load_problems(path, on_bad_row=on_bad_row)
    assert str(info.value) == (
        f"{path}:3: invalid JSON: Unterminated string starting at (column 20)"
    )
    latin = tmp_path / "l.jsonl"
    latin.write_bytes(b'{"question": "q", "answer": "1"}\n{"question": "caf\xe9", "answer": "2"}\n')
    with pytest.raises(ValueError, match="^" + re.escape(f"{latin}:2: invalid JSON")):
        load_problems(latin, on_bad_row=on_bad_row)


def test_a_json_array_loads_as_training_data_with_each_items_line(tmp_path):
    path = tmp_path / "t.json"
    path.write_text(
        '[\n  {"id": "a", "question": "1+1?", "answer": "2"},\n'
        '  {"id": "b", "question": "q"},\n\n  {"id": "c", "question": "2+2?",\n   "answer": 4}\n]\n',
        "utf-8",
    )
    result = load_quietly(path)
    assert [(p.id, p.answer) for p in result.problems] == [("a", "2"), ("c", "4")]
    assert result.bad_rows == [BadRow(f"{path}:3", "missing answer (field 'answer')")]
    path.write_text('[{"question": "q", "answer": "1"},\n {"question": "q2" "answer": "2"}]')
    with pytest.raises(ValueError) as info:
        load_problems(path)
    assert str(info.value) == f"{path}:2: invalid JSON: Expecting ',' delimiter (column 20)"
    path.write_text('[{"question": "q", "answer": "1"}]\n{"question": "q2", "answer": "2"}\n')
    with pytest.raises(ValueError, match=re.escape(f"{path}:1: invalid JSON: text after")):
        load_problems(path)


def test_fields_as_a_plain_dict(tmp_path):
    rows = [{"problem": "1+1?", "answer": "2", "sols": ["1+1=2"], "id": "a"}]
    result = load_problems(rows, fields={"question": "problem", "solutions": "sols"})
    assert result.problems == [Problem("a", "1+1?", "2", ("1+1=2",), {})]
    assert as_field_map({"question": "problem", "id": None}) == FieldSettings("problem", id=None)
    mapping = FieldSettings("q", "a")
    assert as_field_map(mapping) is mapping
    path = write_jsonl(tmp_path / "p.jsonl", [{"problem": "p", "expected_answer": "1"}])
    by_dict = load_problems(path, fields={"question": "problem", "answer": "expected_answer"})
    assert [(p.question, p.answer) for p in by_dict.problems] == [("p", "1")]


def test_bad_fields_and_settings_are_listed_in_one_error():
    with pytest.raises(ValueError) as info:
        as_field_map({"questoin": "problem", "question": None, "answer": " ", "id": 3})
    assert str(info.value) == (
        "fields has unknown key 'questoin'; allowed keys: question, answer, solutions, id; "
        "fields.question must be a non-empty str (a column name), got None; "
        "fields.answer must be a non-empty str or null (a column name), got ' '; "
        "fields.id must be a non-empty str or null (a column name), got 3"
    )
    with pytest.raises(ValueError, match=r"^fields must be a FieldSettings or a dict with keys"):
        as_field_map(["question"])
    with pytest.raises(ValueError) as info:
        load_problems([{"question": "q", "answer": "1"}], {"sol": "s"}, on_bad_row="x", limit=0)
    assert str(info.value) == (
        "fields has unknown key 'sol'; allowed keys: question, answer, solutions, id; "
        "on_bad_row must be one of ('skip', 'raise'), got 'x'; "
        "limit must be None or an int >= 1, got 0"
    )


def test_benchmark_sources_refuse_bad_local_files(tmp_path):
    missing = tmp_path / "nope.jsonl"
    with pytest.raises(FileNotFoundError, match=r"problem source 'mine': path=.*nope\.jsonl"):
        load_benchmark(f"mine?path={missing}")
    bad_line = tmp_path / "m.jsonl"
    bad_line.write_text('{"problem": "q", "answer": "1"}\n{oops\n', encoding="utf-8")
    with pytest.raises(ValueError, match="^" + re.escape(f"{bad_line}:2: invalid JSON")):
        load_benchmark(f"mine?path={bad_line}")
    empty = tmp_path / "e.jsonl"
    empty.write_text("", encoding="utf-8")
    with pytest.raises(ValueError, match=r"^mine\?path=.*e\.jsonl holds 0 usable problems"):
        load_benchmark(f"mine?path={empty}")

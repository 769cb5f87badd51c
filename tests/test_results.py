"""`ResultsFile` resumes: lines written at their input positions, kept lines that wait in
`results.jsonl.rest` never lost nor written twice, however often a resume is cut short."""

from __future__ import annotations

import json
from pathlib import Path

from inferchain.results import REST, RESULTS, ResultsFile

KEYS = [f"/in/{i}.npy" for i in range(6)]


def line(i: int, error: bool = False) -> dict[str, object]:
    record: dict[str, object] = {"key": KEYS[i], "file": f"{i}.npy"}
    return record | ({"error": "ValueError: bad"} if error else {"y": i})


def written(folder: Path) -> list[dict[str, object]]:
    return [json.loads(t) for t in (folder / RESULTS).read_text(encoding="utf-8").splitlines()]


def test_a_resume_cut_short_while_it_rewrites_loses_and_repeats_nothing(tmp_path: Path) -> None:
    with ResultsFile(tmp_path, "new") as first:
        first.plan(KEYS)
        for i in range(6):
            first.write(line(i, error=i in (0, 3)), i)
    cut = ResultsFile(tmp_path, "resume").open()
    assert cut.plan(KEYS) == {1, 2, 4, 5}
    assert (tmp_path / REST).is_file() and written(tmp_path) == []  # 0 runs first
    cut.write(line(0), 0)  # ... and the process dies here: no close()
    cut._sink.close()  # type: ignore[union-attr]  # (the OS closes it)
    again = ResultsFile(tmp_path, "resume").open()
    assert again.plan(KEYS) == {0, 1, 2, 4, 5}
    with again:
        again.write(line(3), 3)
    assert written(tmp_path) == [line(i) for i in range(6)]
    assert not (tmp_path / REST).exists()


def test_a_resume_with_nothing_to_move_keeps_the_file_and_cuts_a_torn_tail(
    tmp_path: Path,
) -> None:
    with ResultsFile(tmp_path, "new") as first:
        first.plan(KEYS)
        for i in range(3):
            first.write(line(i), i)
    path = tmp_path / RESULTS
    whole = path.read_bytes()
    path.write_bytes(whole + b'{"key": "/in/3.npy", "fi')  # torn by a kill
    with ResultsFile(tmp_path, "resume") as resumed:
        assert resumed.plan(KEYS) == {0, 1, 2}
        assert not (tmp_path / REST).exists()
        for i in range(3, 6):
            resumed.write(line(i), i)
    assert path.read_bytes().startswith(whole)
    assert written(tmp_path) == [line(i) for i in range(6)]


def test_lines_of_inputs_no_longer_given_are_kept_where_they_were(tmp_path: Path) -> None:
    with ResultsFile(tmp_path, "new") as first:
        first.plan(KEYS)
        for i in range(6):
            first.write(line(i, error=i == 0), i)
    fewer = [KEYS[0], KEYS[1], KEYS[4], KEYS[5]]  # 2 and 3 are gone from the inputs
    with ResultsFile(tmp_path, "resume") as resumed:
        assert resumed.plan(fewer) == {1, 2, 3}
        resumed.write(line(0), 0)
    assert written(tmp_path) == [line(i) for i in range(6)]

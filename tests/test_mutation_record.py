"""`make mutate` goes on in a new checkout from the verdicts recorded in the repository (tests/mutation.py)."""
import gzip
import json

import pytest

from tests import mutation


@pytest.fixture
def layout(tmp_path, monkeypatch):
    work = tmp_path / "var" / "mutation"
    monkeypatch.setattr(mutation, "WORK", work)
    monkeypatch.setattr(mutation, "MUTANTS", work / "mutants")
    monkeypatch.setattr(mutation, "RECORD", tmp_path / "record")
    return work / "mutants"


def meta(verdicts: dict) -> str:
    return json.dumps({"exit_code_by_key": verdicts, "hash_by_function_name": {"f": "abc"}})


def write(path, text: str) -> None:
    path.parent.mkdir(parents=True, exist_ok=True)
    path.write_text(text)


def test_a_recorded_run_is_put_back_in_a_new_checkout(layout):
    write(layout / "src" / "tenancy" / "scoping.py.meta", meta({"tenancy.scoping.x_f__mutmut_1": 1}))
    write(layout / "tools" / "calls" / "worker.py.meta", meta({"tools.calls.worker.x_g__mutmut_1": None}))
    write(layout / mutation.STATS, json.dumps({"duration_by_test": {"tests/a.py::t": 0.5}}))
    mutation.record()

    recorded = sorted(str(p.relative_to(mutation.RECORD)) for p in mutation.RECORD.rglob("*") if p.is_file())
    assert recorded == ["mutmut-stats.json.gz", "src/tenancy/scoping.py.meta", "tools/calls/worker.py.meta"]
    first = (mutation.RECORD / "mutmut-stats.json.gz").read_bytes()

    originals = {p: p.read_bytes() for p in layout.rglob("*") if p.is_file()}
    for path in originals:
        path.unlink()
    mutation.restore()
    assert {p: p.read_bytes() for p in layout.rglob("*") if p.is_file()} == originals

    mutation.record()  # the same stats again: the same bytes, nothing to commit
    assert (mutation.RECORD / "mutmut-stats.json.gz").read_bytes() == first


def test_a_checkout_keeps_its_own_verdicts_over_the_record(layout):
    write(layout / "approvals" / "engine.py.meta", meta({"approvals.engine.x_d__mutmut_1": 0}))
    write(layout / mutation.STATS, "{}")
    mutation.record()
    newer = meta({"approvals.engine.x_d__mutmut_1": 1})
    write(layout / "approvals" / "engine.py.meta", newer)
    write(layout / mutation.STATS, '{"newer": true}')
    mutation.restore()
    assert (layout / "approvals" / "engine.py.meta").read_text() == newer
    assert (layout / mutation.STATS).read_text() == '{"newer": true}'


def test_a_record_holds_only_what_the_last_run_had(layout):
    write(layout / "approvals" / "engine.py.meta", meta({}))
    write(layout / "approvals" / "matching.py.meta", meta({}))
    mutation.record()
    (layout / "approvals" / "matching.py.meta").unlink()
    mutation.record()
    assert [p.name for p in mutation.RECORD.rglob("*.meta")] == ["engine.py.meta"]
    assert not (mutation.RECORD / "mutmut-stats.json.gz").exists()


def test_nothing_to_record_without_a_run(layout):
    with pytest.raises(SystemExit, match="nothing to record"):
        mutation.record()
    assert not mutation.RECORD.exists()


def test_the_stats_are_recorded_compressed(layout):
    stats = {"tests_by_mangled_function_name": {"tenancy.scoping.x_f": ["tests/a.py::t"] * 200}}
    write(layout / "src" / "x.py.meta", meta({}))
    write(layout / mutation.STATS, json.dumps(stats))
    mutation.record()
    packed = (mutation.RECORD / "mutmut-stats.json.gz").read_bytes()
    assert json.loads(gzip.decompress(packed)) == stats
    assert len(packed) < len(json.dumps(stats)) / 10

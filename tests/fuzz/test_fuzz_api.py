"""Schemathesis fuzzes the live API (docs/notes/entry-and-admission.md, "OpenAPI and fuzzing") with an agent key
and an admin key.

A real daphne process with the bootstrapped demo tenant (`fuzz_server`, shared with the MCP fuzz) answers every
operation of /api/schema/ with generated requests, valid and invalid, all checks on: no 5xx, every answer as
documented (status, headers, body), invalid input refused, valid input accepted. What the run finds fails
the test unless tests/fuzz/departures.toml lists it with a reason. `schemathesis_run.py` says how the run is
made deterministic and bounded, and runs it by hand too.
"""
import pytest

from tests.fuzz.schemathesis_run import fuzz, triage

pytestmark = [pytest.mark.live, pytest.mark.xdist_group("fuzz")]


def test_the_api_holds_up_against_the_fuzzer(fuzz_server):
    server = fuzz_server
    results, departures = fuzz(server.url, server.api_key, server.admin_api_key)
    unlisted = []
    for result in results:
        print(f"{result.key} key: {result.cases} cases in {result.seconds:.0f} s, {len(result.findings)} findings")
        assert not result.errors, "\n".join(result.errors)
        assert result.cases >= 300, f"the {result.key} run hardly ran:\n{result.output[-3000:]}"
        unlisted += triage(result.findings, departures)
    assert not unlisted, "not listed in tests/fuzz/departures.toml:\n" + "\n".join(f.describe() for f in unlisted)

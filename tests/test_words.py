"""One spelling (docs/notes/console.md, "Words"): the console, the API's schema, the docs and the platform's
skills write American English, as the API's field names (`behavior`, `default_behavior`) always have."""
import re
from pathlib import Path

import pytest

ROOT = Path(__file__).resolve().parent.parent
BRITISH = re.compile(r"\b\w*(behaviour|colour|favour|honour|licence|catalogue|centre"
                     r"|(normali|seriali|organi|recogni|summari|customi|authori|initiali|prioriti)s(e|es|ed|ing|ation))\w*\b",
                     re.I)


def _texts():
    for folder, pattern in (("templates", "**/*.html"), ("templates", "**/*.txt"), ("docs", "**/*.md"),
                            ("skills", "*/SKILL.md")):
        yield from sorted((ROOT / folder).glob(pattern))
    yield ROOT / "README.md"


def test_the_console_docs_and_skills_use_one_spelling():
    found = [f"{path.relative_to(ROOT)}: {match.group(0)}" for path in _texts()
             for match in BRITISH.finditer(path.read_text())]
    assert not found, found


@pytest.mark.django_db
def test_the_api_schema_uses_one_spelling(client):
    schema = client.get("/api/schema/", HTTP_ACCEPT="application/json")
    assert schema.status_code == 200
    assert "\"behavior\"" in schema.content.decode()  # the field that set the spelling
    assert not BRITISH.findall(schema.content.decode())

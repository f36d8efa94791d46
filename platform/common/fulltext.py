"""Free-text queries made safe for the full-text engines: the words worth searching for, nothing else.

A query comes from a model or a person, so it is hostile input: it is cut into `\\w+` words, lower-cased,
stop words dropped, each word once, at most MAX_TERMS of them. A term is then only letters, digits and
underscores, which carry no syntax of PostgreSQL's tsquery; for SQLite's FTS5 each is a quoted string (a
phrase), so no word can be an FTS5 operator (`AND`, `NEAR`, a column filter). Used by the knowledge search
(knowledge.fts) and the tool search (tools.catalog.search).
"""
import re

# PostgreSQL's `english` stop words, so both backends ignore the same words in a query.
_STOP_WORDS_TEXT = """
a about above after again against all am an and any are as at be because been before being below between both
but by can did do does doing don down during each few for from further had has have having he her here hers
herself him himself his how i if in into is it its itself just me more most my myself no nor not now of off on
once only or other our ours ourselves out over own s same she should so some such t than that the their theirs
them themselves then there these they this those through to too under until up very was we were what when
where which while who whom why will with you your yours yourself yourselves
"""
STOP_WORDS = frozenset(_STOP_WORDS_TEXT.split())
MAX_TERMS = 24
_WORD = re.compile(r"\w+", re.UNICODE)


def query_terms(query: str) -> list[str]:
    """The words of a free-text query worth searching for: lower-cased, stop words out, each once."""
    seen: dict[str, None] = {}
    for word in _WORD.findall(query.lower()):
        word = word.strip("_")
        if word and word not in STOP_WORDS and len(word) <= 64:
            seen.setdefault(word, None)
    return list(seen)[:MAX_TERMS]


def postgres_tsquery(terms: list[str]) -> str:
    """The text for to_tsquery(): terms OR-ed. Terms are \\w+ runs, so they carry no tsquery syntax."""
    return " | ".join(terms)


def sqlite_match(terms: list[str], operator: str = "OR") -> str:
    """An FTS5 query of the terms joined by `operator` ("OR": any of them, bm25 favouring rows with more;
    "AND": all of them). Each term is a quoted string, so nothing in a query is FTS5 syntax."""
    if operator not in ("OR", "AND"):
        raise ValueError(operator)
    return f" {operator} ".join('"' + term.replace('"', '""') + '"' for term in terms)

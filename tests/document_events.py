"""The work of reading a document, counted: the events `common.documents`' parser hands out (tests of the
bounds count work, never time it)."""
from common import documents


def counted_events(monkeypatch) -> dict:
    """From now on in the test, `["events"]` of the returned dict counts the events the parser hands out."""
    seen = {"events": 0}
    real = documents.event_parser

    def counting(text, max_depth):
        parser = real(text, max_depth)
        get_event = parser.get_event

        class Counting:
            check_event, dispose = parser.check_event, parser.dispose

            def get_event(self):
                seen["events"] += 1
                return get_event()

        return Counting()

    monkeypatch.setattr(documents, "event_parser", counting)
    return seen

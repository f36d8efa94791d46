"""How a request gets in: who is calling (API keys, console sessions), the one admission every entry makes, the
rate limits it applies, and the bounds on request bodies (docs/notes/entry-and-admission.md)."""

"""A call from submit to settle: the governed pipeline, the runtimes and executors, running one call,
the steps after it, its events, waiting for calls, and the live streams. Owner of everything a call does."""

"""A bench-only tool (installed by bench/dist_settings.py, so daphne, the worker and manage.py all
register it): emits progress events as fast as it can, each carrying its emit time."""
import time

from tools.python.decorators import ToolContext, ToolError, tool


@tool(read_only=True, idempotent=True, timeout=300, groups=("bench",))
def bench_emit(count: int = 1000, interval_ms: float = 0, ctx: ToolContext = None) -> dict:
    """Emit `count` progress events; each event's text is the wall-clock time of its emit (time.time()).

    Args:
        count: How many events, 1 to 100000.
        interval_ms: Pause between events in milliseconds (0: as fast as possible).
    """
    if not 1 <= count <= 100_000:
        raise ToolError("count must be between 1 and 100000", error_type="InvalidInput")
    started = time.perf_counter()
    for n in range(count):
        ctx.emit(repr(time.time()), progress=(n + 1) / count)
        if interval_ms > 0:
            time.sleep(interval_ms / 1000)
    return {"events": count, "emit_s": time.perf_counter() - started}

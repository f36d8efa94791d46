"""The floor endpoint's table: created by the benchmark itself, no product model (see bench_floor.py)."""
import sqlite3

FLOOR_TABLE = "bench_floor_row"
# Under /api/ so that it takes the same HTTP entry as the API (toolkeeper.handlers).
FLOOR_PATH = "/api/bench/floor"
CREATE_TABLE = (
    f"CREATE TABLE IF NOT EXISTS {FLOOR_TABLE} ("
    " id INTEGER PRIMARY KEY AUTOINCREMENT, tenant_id INTEGER NOT NULL, body TEXT NOT NULL, at TEXT NOT NULL)"
)


def create_floor_table(server) -> None:
    """Create the table in a started embedded server's SQLite database."""
    with sqlite3.connect(server.data_dir / "common.sqlite3") as db:
        db.execute(CREATE_TABLE)

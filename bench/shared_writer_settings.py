"""Settings for bench/embedded_cores.py only: the product's settings with the SQLite backend whose writer lock is
shared by the server processes of one data dir (bench_shared_writer). Never used by the product."""
from toolkeeper.settings import *  # noqa: F403

DATABASES["default"]["ENGINE"] = "bench_shared_writer"  # noqa: F405

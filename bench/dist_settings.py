"""Settings for bench/events.py and bench/throughput.py only: the product's settings plus the
bench-only tool module `dist_tools`. Never used by the product; bench/ is on PYTHONPATH only for
the benchmarks' own servers and workers."""
from toolkeeper.settings import *  # noqa: F403
from toolkeeper.settings import INSTALLED_APPS

INSTALLED_APPS = [*INSTALLED_APPS, "dist_tools"]

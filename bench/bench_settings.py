"""Settings for bench/call_overhead.py only: the product's settings plus the floor endpoint's URL conf.

Never used by the product; bench/ is on PYTHONPATH only for the benchmark's own server.
"""
from toolkeeper.settings import *  # noqa: F403

ROOT_URLCONF = "bench_urls"

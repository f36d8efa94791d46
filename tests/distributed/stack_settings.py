"""Settings of the distributed test stack: the product's settings plus the test-only tools of
`tests.distributed.stack_tools` (registered in daphne, the worker and manage.py alike)."""
from toolkeeper.settings import *  # noqa: F403
from toolkeeper.settings import INSTALLED_APPS

INSTALLED_APPS = [*INSTALLED_APPS, "tests.distributed.stack_tools"]
TOOLKEEPER_TOOL_PROCESSES = 1  # per worker process

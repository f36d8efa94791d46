"""Settings of the live server the MCP conformance suite runs against: the product's settings plus the
suite's fixture tools (`conformance_tools`), registered in daphne and manage.py alike."""
from toolkeeper.settings import *  # noqa: F403
from toolkeeper.settings import INSTALLED_APPS

INSTALLED_APPS = [*INSTALLED_APPS, "tests.mcp.conformance.conformance_tools"]

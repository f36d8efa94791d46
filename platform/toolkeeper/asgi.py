"""ASGI entry point: HTTP through Django, WebSockets through Channels."""
import gc
import os
import sys
from pathlib import Path

_root = Path(__file__).resolve().parent.parent.parent
for _path in (str(_root / "platform"), str(_root)):
    if _path not in sys.path:
        sys.path.insert(0, _path)
os.environ.setdefault("DJANGO_SETTINGS_MODULE", "toolkeeper.settings")

from django.core.asgi import get_asgi_application  # noqa: E402

django_asgi_app = get_asgi_application()

from django.conf import settings  # noqa: E402

if settings.DEVELOPMENT:
    # A development deployment serves static files (the Django admin's) itself.
    from django.contrib.staticfiles.handlers import ASGIStaticFilesHandler

    django_asgi_app = ASGIStaticFilesHandler(django_asgi_app)

from channels.routing import ProtocolTypeRouter, URLRouter  # noqa: E402

from toolkeeper.handlers import http_application  # noqa: E402

if "daphne.server" in sys.modules:
    # Served by daphne, which receives whole bodies before the application runs: refuse them as they arrive.
    from toolkeeper.daphne_request import use_in_daphne

    use_in_daphne()
from common import metrics  # noqa: E402
from toolkeeper.metrics import side_server_start  # noqa: E402
from toolkeeper.routing import websocket_urlpatterns  # noqa: E402
from tools.calls.runtime import runtime  # noqa: E402

# The metrics files of processes that ended are removed (never a running one's); the scrape's own address, if set.
metrics.sweep()
side_server_start()

# The mode's duties of a server process (embedded: recover orphaned calls, run the periodic jobs).
runtime().start()

# Everything loaded so far lives as long as the process: keep it out of the garbage collector's
# full passes, which otherwise rescan it and show up as latency spikes.
gc.collect()
gc.freeze()

application = ProtocolTypeRouter(
    {
        "http": http_application(django_asgi_app),
        "websocket": URLRouter(websocket_urlpatterns),
    }
)

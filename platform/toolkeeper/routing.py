"""WebSocket routes (DESIGN §9)."""
from realtime.routing import websocket_urlpatterns

__all__ = ["websocket_urlpatterns"]

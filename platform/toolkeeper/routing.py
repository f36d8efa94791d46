"""WebSocket routes (docs/notes/realtime.md): every app's streams."""
from approvals.streams import websocket_urlpatterns as approval_streams
from tools.calls.streams import websocket_urlpatterns as call_streams

websocket_urlpatterns = [*call_streams, *approval_streams]

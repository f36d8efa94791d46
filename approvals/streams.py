"""The inbox's WebSocket stream (docs/notes/realtime.md): new and settled approval requests, for the inbox list and
the pending count. The shared machinery is `realtime.consumers`."""
from realtime.consumers import ConsoleStream
from realtime.groups import inbox_group
from realtime.routing import console_socket


class ConsoleInboxStream(ConsoleStream):
    def authorize(self):
        tenant = self.member_tenant()
        if tenant is None:
            return None
        self.tenant_id = tenant.pk
        self.group = inbox_group(tenant.pk)
        return tenant


websocket_urlpatterns = [
    console_socket("ws/console/<slug:tenant>/inbox/", ConsoleInboxStream),
]

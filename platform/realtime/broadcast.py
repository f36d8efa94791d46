"""Broadcast after commit: a watcher never hears of a row it cannot read yet."""
import logging

from asgiref.sync import async_to_sync
from channels.layers import get_channel_layer
from django.db import transaction

logger = logging.getLogger("toolkeeper.realtime")


def publish(groups: list[str], message: dict) -> None:
    """Send now, from sync code on any thread. A broadcast failure never fails the write it reports."""
    layer = get_channel_layer()
    if layer is None:
        return
    for group in groups:
        try:
            if hasattr(layer, "group_send_sync"):
                layer.group_send_sync(group, message)
            else:
                async_to_sync(layer.group_send)(group, message)
        except Exception:
            logger.warning("broadcast to %s failed", group, exc_info=True)


def publish_on_commit(groups: list[str], message: dict) -> None:
    transaction.on_commit(lambda: publish(groups, message))

"""Notification channel kinds: the ways a queue's messages reach people.

A kind is what `NotificationChannel.kind` holds, and it says how a message of that channel is sent. The approvals
app registers its three (a signed webhook, a Slack-compatible webhook, email to the queue's reviewers) from
`AppConfig.ready`; another app adds one the same way, without editing this app (docs/architecture.md, Where to
add…).
"""
import re
from collections.abc import Callable
from dataclasses import dataclass

CHANNEL_KIND = re.compile(r"[a-z][a-z0-9_]{0,31}")  # fits NotificationChannel.kind


@dataclass(frozen=True)
class ChannelKind:
    """`send(notification, payload)` delivers one message (its payload with the decision links made) and raises
    on any failure, which is retried with backoff. A kind `to_reviewers` writes one message per reviewer of the
    queue, to their email address, and takes no URL or secret; any other kind posts to the channel's URL, which
    it needs, and `signed` says whether it needs a signing secret too."""

    name: str
    label: str
    send: Callable
    to_reviewers: bool = False
    signed: bool = False


_kinds: dict[str, ChannelKind] = {}


def register_channel_kind(kind: ChannelKind) -> None:
    """Add a channel kind. A name is claimed once."""
    if not CHANNEL_KIND.fullmatch(kind.name):
        raise ValueError(f"a channel kind is 1-32 lowercase letters, digits or '_', starting with a letter: "
                         f"{kind.name!r}")
    held = _kinds.get(kind.name)
    if held is not None and held != kind:
        raise ValueError(f"the channel kind {kind.name!r} is registered already")
    _kinds[kind.name] = kind


def channel_kind(name) -> ChannelKind | None:
    return _kinds.get(name) if isinstance(name, str) else None


def channel_kind_names() -> list[str]:
    return list(_kinds)


def channel_kind_choices() -> list[tuple[str, str]]:
    return [(kind.name, kind.label) for kind in _kinds.values()]


def reviewer_kind_names() -> list[str]:
    """The kinds that write to reviewers' addresses: the channels a reviewer can mute for themselves."""
    return [kind.name for kind in _kinds.values() if kind.to_reviewers]

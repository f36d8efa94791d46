"""Console routes of the inbox, the rules page and the queues page, mounted under /t/<slug:tenant>/.

Parameter names are fixed (the cross-tenant URL-conf walk substitutes ids by name):
`tenant` (slug), `request_id` (ApprovalRequest), `rule_id`, `queue_id`, `call_id` (ToolCall uuid),
`approval_grant_id` (Grant); what each names is declared here for `tenant_view`.
"""
from django.urls import path

from approvals import views
from approvals.models import ApprovalRequest, Grant, NotificationChannel, PermissionRule, Queue
from audit.pages import TargetLink, register_target_links
from tenancy.web import register_url_objects
from tools.models import ToolCall

app_name = "inbox"

register_url_objects({
    "request_id": (ApprovalRequest, "approval"),
    "rule_id": (PermissionRule, "rule"),
    "queue_id": (Queue, "queue"),
    "call_id": (ToolCall, "call"),
    "channel_id": (NotificationChannel, "channel"),
    "approval_grant_id": (Grant, "grant"),
})
register_target_links({
    "rule": TargetLink(PermissionRule, "pk", "inbox:rule_edit", "rule_id"),
    "queue": TargetLink(Queue, "name", "inbox:queue_edit", "queue_id"),
    "grant": TargetLink(Grant, "pk", "inbox:grant_revoke", "approval_grant_id"),
})

urlpatterns = [
    path("inbox/", views.inbox, name="inbox"),
    path("inbox/history/", views.inbox_history, name="inbox_history"),
    path("inbox/external/", views.inbox_external, name="inbox_external"),
    path("inbox/external/<str:call_id>/", views.inbox_external_respond, name="inbox_external_respond"),
    path("inbox/<int:request_id>/", views.inbox_request, name="inbox_request"),
    path("inbox/notifications/", views.my_notifications, name="my_notifications"),
    path("inbox/act/", views.inbox_act, name="inbox_act"),
    path("grants/", views.grant_list, name="grant_list"),
    path("grants/<int:approval_grant_id>/revoke/", views.grant_revoke, name="grant_revoke"),
    path("inbox/slack/link/", views.slack_link, name="slack_link"),
    path("inbox/notifications/slack/unlink/", views.slack_unlink, name="slack_unlink"),
    path("rules/", views.rule_list, name="rule_list"),
    path("rules/new/", views.rule_create, name="rule_create"),
    path("rules/<int:rule_id>/", views.rule_edit, name="rule_edit"),
    path("rules/<int:rule_id>/delete/", views.rule_delete, name="rule_delete"),
    path("queues/", views.queue_list, name="queue_list"),
    path("queues/new/", views.queue_create, name="queue_create"),
    path("queues/<int:queue_id>/", views.queue_edit, name="queue_edit"),
    path("queues/<int:queue_id>/delete/", views.queue_delete, name="queue_delete"),
    path("queues/<int:queue_id>/notifications/", views.queue_notifications, name="queue_notifications"),
    path("queues/<int:queue_id>/channels/<int:channel_id>/", views.channel_edit, name="channel_edit"),
    path("queues/<int:queue_id>/channels/<int:channel_id>/delete/", views.channel_delete, name="channel_delete"),
    path("queues/<int:queue_id>/channels/<int:channel_id>/test/", views.channel_test, name="channel_test"),
]

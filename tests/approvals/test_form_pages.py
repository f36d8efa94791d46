"""The rules and queues pages, declared (tests/view_cases.py): operators and admins change them, reviewers and
viewers are refused (403), bad input is a 400 naming the problem with nothing saved, another tenant's rules
and queues are 404."""
from datetime import timedelta

from approvals.models import PermissionRule, Queue
from approvals.services import queue_save, rule_create
from tests.view_cases import CreateCases, DeleteCases, EditCases, RefusingDeleteCases


def rule_body(**values) -> dict:
    body = {"behavior": "ask", "tool_pattern": "mcp__github__*", "arg_match": "", "agents": "", "users": "",
            "queue": "", "priority": "0", "enabled": "on", "note": ""}
    body.update(values)
    return body


def queue_body(**values) -> dict:
    body = {"name": "security", "description": "", "required_approvals": "1", "expires_after_minutes": "",
            "escalate_after_minutes": ""}
    body.update(values)
    return body


def _rule(tw):
    return rule_create(tenant=tw.tenant, behavior="ask", tool_pattern="shell", note="a look first")


def _queue(tw):
    return queue_save(tenant=tw.tenant, name="security", required_approvals=1)


INVALID_RULES = [
    (rule_body(arg_match='{"command": '), "not valid JSON"),
    (rule_body(arg_match='["git *"]'), "must be a JSON object"),
    (rule_body(arg_match='{"command": 5}'), "an object of argument name"),
    (rule_body(tool_pattern="   "), "This field is required"),
    (rule_body(behavior="maybe"), "Select a valid choice"),
    (rule_body(priority="high"), "Enter a whole number"),
]


class TestRuleCreate(CreateCases):
    url_name = "inbox:rule_create"
    model = PermissionRule
    audit_verb = "rule.created"
    success_url = "inbox:rule_list"

    def valid(self, world):
        return (rule_body(tool_pattern="shell", arg_match='{"command": "git push *"}', agents="ops-bot"),
                {"behavior": "ask", "tool_pattern": "shell", "arg_match": {"command": "git push *"},
                 "agents": ["ops-bot"]})

    def invalid(self, world):
        theirs = queue_save(tenant=world.b.tenant, name="globex-q")  # a queue of another tenant is no choice
        return [*INVALID_RULES, (rule_body(queue=str(theirs.pk)), "Select a valid choice")]


class TestRuleEdit(EditCases):
    url_name = "inbox:rule_edit"
    param = "rule_id"
    model = PermissionRule
    audit_verb = "rule.updated"
    success_url = "inbox:rule_list"

    def target(self, tw):
        return _rule(tw)

    def valid(self, world):
        return rule_body(behavior="deny", tool_pattern="shell", enabled=""), {"behavior": "deny", "enabled": False}

    def invalid(self, world):
        return INVALID_RULES


class TestRuleDelete(DeleteCases):
    url_name = "inbox:rule_delete"
    param = "rule_id"
    model = PermissionRule
    audit_verb = "rule.deleted"
    success_url = "inbox:rule_list"

    def target(self, tw):
        return _rule(tw)


class TestQueueCreate(CreateCases):
    url_name = "inbox:queue_create"
    model = Queue
    audit_verb = "queue.created"
    success_url = "inbox:queue_list"

    def valid(self, world):
        return (queue_body(required_approvals="2", four_eyes="on", expires_after_minutes="90"),
                {"name": "security", "required_approvals": 2, "four_eyes": True,
                 "expires_after": timedelta(minutes=90)})

    def invalid(self, world):
        taken = queue_save(tenant=world.a.tenant, name="taken")
        return [
            (queue_body(name="not a slug!"), "Enter a valid"),
            (queue_body(required_approvals="0"), "greater than or equal to 1"),
            (queue_body(expires_after_minutes="-5"), "greater than or equal to 1"),
            (queue_body(name=taken.name), "a queue named"),
            (queue_body(name="x", reviewers=[world.b.users["reviewer"].pk]), "Select a valid choice"),
        ]


class TestQueueEdit(EditCases):
    url_name = "inbox:queue_edit"
    param = "queue_id"
    model = Queue
    audit_verb = "queue.updated"
    success_url = "inbox:queue_list"

    def target(self, tw):
        return _queue(tw)

    def valid(self, world):
        return queue_body(required_approvals="3", description="Risky changes"), {"required_approvals": 3,
                                                                                 "description": "Risky changes"}

    def invalid(self, world):
        return [(queue_body(required_approvals="0"), "greater than or equal to 1"),
                (queue_body(name="default"), "a queue named")]


class TestQueueDelete(RefusingDeleteCases):
    url_name = "inbox:queue_delete"
    param = "queue_id"
    model = Queue
    audit_verb = "queue.deleted"
    success_url = "inbox:queue_list"
    refused_message = "make another queue the default first"

    def target(self, tw):
        return _queue(tw)

    def refused_target(self, tw):
        return Queue.objects.for_tenant(tw.tenant).get(is_default=True)

"""Prepare the embedded default for `make run`: seed the demo tenant once, then print how to use it."""
import json
import secrets

from django.conf import settings
from django.contrib.auth import get_user_model
from django.core.management.base import BaseCommand
from django.db import transaction

from approvals.services import queue_save, rule_create
from knowledge.services import dataset_create, documents_ingest_bulk
from skills.models import Skill, SkillSource
from skills.services import skill_update
from tenancy.models import Role, Tenant
from tenancy.services import apikey_create, membership_set, tenant_create
from tools.catalog.services import binding_set, catalog_sync, group_create, group_update, tool_external_create
from tools.models import Tool, ToolGroup

DEMO_TENANT = "demo"
# The demo's people: an admin, and reviewers enough for a queue with four-eyes and a quorum of 2 (three
# members who review, since the session's own user may be one of them).
DEMO_ACCOUNTS = {"operator": Role.ADMIN, "reviewer": Role.REVIEWER, "reviewer2": Role.REVIEWER}


class Command(BaseCommand):
    help = "Seed the demo tenant on first run and print the console URL, logins and API key."

    def add_arguments(self, parser):
        parser.add_argument("--url", default="http://127.0.0.1:8000")

    def handle(self, *args, url, **options):
        credentials_file = settings.DATA_DIR / "demo-credentials.json"
        if not Tenant.objects.filter(slug=DEMO_TENANT).exists():
            credentials = seed_demo()
            credentials_file.parent.mkdir(parents=True, exist_ok=True)
            credentials_file.write_text(json.dumps(credentials, indent=2))
            credentials_file.chmod(0o600)
        for tenant in Tenant.objects.all():
            catalog_sync(tenant=tenant)
        credentials = json.loads(credentials_file.read_text()) if credentials_file.exists() else {}
        out = self.stdout.write
        out("")
        out("Toolkeeper is starting (embedded mode).")
        out(f"  console:  {url}/t/{DEMO_TENANT}/")
        out(f"  API docs: {url}/api/docs/")
        for role in DEMO_ACCOUNTS:
            if role in credentials:
                out(f"  {role} login: {credentials[role]['username']} / {credentials[role]['password']}")
        if "api_key" in credentials:
            out(f"  API key (agent, external): {credentials['api_key']}")
            out(f"  admin API key: {credentials['admin_api_key']}")
        out("")


@transaction.atomic
def seed_demo() -> dict:
    users = get_user_model().objects
    credentials = {}
    accounts = {}
    for name in DEMO_ACCOUNTS:
        password = secrets.token_urlsafe(9)
        user = users.filter(username=name).first() or users.create_user(username=name)
        user.set_password(password)
        user.save()
        accounts[name] = user
        credentials[name] = {"username": name, "password": password}
    tenant = tenant_create(slug=DEMO_TENANT, name="Demo", admin=None, default_behavior="allow")
    for name, role in DEMO_ACCOUNTS.items():
        membership_set(tenant=tenant, user=accounts[name], role=role)
    groups = {g.name: g for g in ToolGroup.objects.for_tenant(tenant)}
    notes = {
        "math": ("Exact arithmetic.", "Use calculate for any arithmetic; never compute in your head."),
        "ops": ("Long-running demo operations.", "countdown streams progress; use it to watch a live call."),
    }
    for name, (description, note) in notes.items():
        if name in groups:
            group_update(group=groups[name], description=description, notes=note)
    # The platform skills, on for the demo, each switching on the group of the tools it teaches.
    groups = {g.name: g for g in ToolGroup.objects.for_tenant(tenant)}
    for skill_name, group_name in (("incident-triage", "knowledge"), ("call-history-review", "reports")):
        skill = Skill.objects.for_tenant(tenant).filter(name=skill_name, source=SkillSource.PLATFORM).first()
        if skill is not None and group_name in groups:
            skill_update(skill=skill, enabled=True)
            group_update(group=groups[group_name], skill_ref=skill_name)
    seed_demo_governance(tenant, operator=accounts["operator"])
    clock = Tool.objects.for_tenant(tenant).get(name="current_time")
    binding_set(tenant=tenant, tool=clock, name="timezone", value="Europe/Berlin", agent="support-bot")
    issued = apikey_create(tenant=tenant, name="demo agent", scopes=["agent", "external"],
                           created_by=accounts["operator"])
    admin_key = apikey_create(tenant=tenant, name="demo admin", scopes=["admin"], created_by=accounts["operator"])
    handbook = dataset_create(tenant=tenant, name="handbook", description="How we work: a small demo knowledge base.")
    documents_ingest_bulk(tenant=tenant, dataset=handbook, documents=[
        {"title": "Expense policy", "metadata": {"department": "finance"},
         "text": "Submit expenses within 30 days with a receipt. Travel over 500 EUR needs a manager's approval "
                 "before booking. Meals on business trips are refunded up to 40 EUR a day."},
        {"title": "VPN setup", "metadata": {"department": "it"},
         "text": "Install WireGuard, import the profile from the IT portal and connect before opening internal "
                 "tools. If the VPN drops, reconnect and check that your laptop's clock is correct."},
        {"title": "On-call runbook", "metadata": {"department": "engineering"},
         "text": "When paged, acknowledge within 5 minutes, open an incident channel, and post updates every "
                 "30 minutes until the incident is resolved. Hand over at 9:00 with a written summary."},
    ])
    credentials["api_key"] = issued.key
    credentials["admin_api_key"] = admin_key.key
    return credentials


def seed_demo_governance(tenant, *, operator) -> None:
    """What the demo shows of governance: support-bot's writes wait for a reviewer, a guest agent may never
    write (and so is not shown the tool), and refunds are an external tool the billing system performs."""
    # The queue names no reviewers: every member who reviews works it, and so may the admin API key (the
    # README's tour approves with it).
    changes = queue_save(tenant=tenant, actor=operator, name="changes",
                         description="Writes an agent wants to make; a reviewer approves each one.")
    rule_create(tenant=tenant, actor=operator, behavior="ask", tool_pattern="slow_write", agents=["support-bot"],
                queue=changes, note="support-bot's writes wait for a reviewer.")
    rule_create(tenant=tenant, actor=operator, behavior="deny", tool_pattern="slow_write", agents=["guest-bot"],
                note="Guests never write.")
    refund = tool_external_create(
        tenant=tenant, name="issue_refund", actor=operator, destructive=True, timeout_s=3600,
        description="Refund an order. The billing system performs it and posts the result.",
        input_schema={"properties": {
            "order_id": {"type": "string", "description": "The order to refund."},
            "amount_eur": {"type": "number", "exclusiveMinimum": 0, "description": "How much to refund."},
            "reason": {"type": "string"},
        }, "required": ["order_id", "amount_eur", "reason"]})
    group_create(tenant=tenant, actor=operator, name="billing", tools=[refund],
                 description="Refunds, performed by the billing system.",
                 notes="issue_refund waits until the billing system has refunded the order; tell the customer "
                       "it is in progress.")

"""The console's create, edit and delete pages, declared (tests/view_cases.py): who may use them, what they
refuse (400, nothing saved), what they save (audited, then a redirect), and that tenant B stays out of reach."""
from tenancy.models import ApiKey, Tenant
from tenancy.services import GOVERNANCE_FIELDS, LIMIT_FIELDS, apikey_create
from tests.view_cases import CreateCases, DeleteCases, EditCases, RefusingDeleteCases, SwitchCases
from tools.catalog.services import binding_set, group_create
from tools.models import BoundArgument, Tool, ToolGroup

LIMITS = {"key_requests_per_minute": 2, "tenant_requests_per_minute": 100, "key_calls_in_flight": 5,
          "tenant_calls_in_flight": 50}


def _group(tw):
    return group_create(tenant=tw.tenant, name="research", description="Look things up.")


class TestToolState(SwitchCases):
    url_name = "console:tool_detail"
    param = "tool_id"
    model = Tool
    readers = ("admin", "operator", "reviewer", "viewer")  # the tool's page; its switch is for operators
    audit_verb = "tool.updated"
    success_url = "console:tool_detail"
    success_params = (("tool_id", "pk"),)

    def target(self, tw):
        return tw.tools["calculate"]

    def valid(self, world):
        return {"enabled": "false"}, {"enabled": False}


class TestGroupCreate(CreateCases):
    url_name = "console:group_create"
    model = ToolGroup
    audit_verb = "group.created"
    success_url = "console:group_list"

    def valid(self, world):
        return ({"name": "research", "description": "Look things up.", "switchable": "on",
                 "tools": [world.a.tools["calculate"].pk]},
                {"name": "research", "description": "Look things up.", "switchable": True, "default_active": False})

    def invalid(self, world):
        return [
            ({"name": "math"}, "a group named &#x27;math&#x27; exists"),
            ({"name": "not a slug!"}, "errorlist"),
            ({"name": ""}, "This field is required."),
            ({"name": "sneaky", "tools": [world.b.tools["calculate"].pk]}, "Select a valid choice"),
        ]


class TestGroupEdit(EditCases):
    url_name = "console:group_edit"
    param = "group_id"
    model = ToolGroup
    audit_verb = "group.updated"
    success_url = "console:group_list"

    def target(self, tw):
        return tw.groups["ops"]

    def valid(self, world):
        return ({"name": "operations", "notes": "Careful.", "default_active": "on"},
                {"name": "operations", "notes": "Careful.", "default_active": True, "switchable": False})

    def invalid(self, world):
        return [({"name": "math", "switchable": "on"}, "exists"), ({"name": ""}, "This field is required.")]


class TestGroupDelete(RefusingDeleteCases):
    url_name = "console:group_delete"
    param = "group_id"
    model = ToolGroup
    audit_verb = "group.deleted"
    success_url = "console:group_list"
    refused_message = "cannot be deleted"

    def target(self, tw):
        return _group(tw)

    def refused_target(self, tw):
        return tw.groups["basic"]


class TestBindingCreate(CreateCases):
    url_name = "console:binding_create"
    model = BoundArgument
    audit_verb = "binding.set"
    success_url = "console:binding_list"

    def valid(self, world):
        return ({"tool": world.a.tools["current_time"].pk, "agent": "", "name": "timezone",
                 "value": '"America/New_York"'},
                {"agent": "", "name": "timezone", "value": "America/New_York"})

    def invalid(self, world):
        tool = world.a.tools["current_time"].pk
        return [
            ({"tool": tool, "name": "timezone", "value": "Europe/Paris"}, "not valid JSON"),
            # the argument is chosen from the tool's schema, and the value is checked against it
            ({"tool": tool, "name": "colour", "value": '"red"'}, "colour is not one of the available choices"),
            ({"tool": tool, "name": "timezone", "value": "7"}, "current_time refuses it: timezone: 7 is not of type"),
            ({"name": "timezone", "value": '"UTC"'}, "This field is required."),
            ({"tool": world.b.tools["current_time"].pk, "name": "timezone", "value": '"UTC"'},
             "Select a valid choice"),
        ]


class TestBindingDelete(DeleteCases):
    url_name = "console:binding_delete"
    param = "binding_id"
    model = BoundArgument
    audit_verb = "binding.deleted"
    success_url = "console:binding_list"

    def target(self, tw):
        return binding_set(tenant=tw.tenant, tool=tw.tools["calculate"], name="expression", value="1+1")


class TestApiKeyCreate(CreateCases):
    url_name = "console:apikey_create"
    model = ApiKey
    allowed = ("admin",)
    refused = ("operator", "reviewer", "viewer")
    audit_verb = "apikey.created"
    success_url = "console:apikey_created"
    success_params = (("key_id", "pk"),)

    def valid(self, world):
        return ({"name": "ci bot", "scopes": ["agent"], "agent": "ci-bot"},
                {"name": "ci bot", "scopes": ["agent"], "agent": "ci-bot"})

    def invalid(self, world):
        return [
            ({"name": "x"}, "This field is required."),
            ({"name": "x", "scopes": ["root"]}, "Select a valid choice"),
            ({"name": "", "scopes": ["agent"]}, "This field is required."),
        ]


class TestApiKeyRevoke(DeleteCases):
    url_name = "console:apikey_revoke"
    param = "key_id"
    model = ApiKey
    allowed = ("admin",)
    refused = ("operator", "reviewer", "viewer")
    audit_verb = "apikey.revoked"
    success_url = "console:apikey_list"

    def target(self, tw):
        return apikey_create(tenant=tw.tenant, name="spare", scopes=["agent"]).api_key

    def done(self, tw, obj) -> bool:
        obj.refresh_from_db()
        return obj.revoked_at is not None


class TestTenantSettings(EditCases):
    url_name = "console:tenant_settings"
    model = Tenant
    audit_verb = "tenant.limits_set"
    success_url = "console:tenant_settings"

    def object_of(self, tw):
        return tw.tenant

    def rows(self, tw):
        return list(Tenant.objects.filter(pk=tw.tenant.pk).values(*LIMIT_FIELDS))

    def valid(self, world):
        return {"section": "limits", **{name: str(value) for name, value in LIMITS.items()}}, LIMITS

    def invalid(self, world):
        return [({"section": "limits", **LIMITS, "key_calls_in_flight": "-3"}, "greater than or equal to 0"),
                ({"section": "limits", **LIMITS, "tenant_calls_in_flight": "many"}, "Enter a whole number")]


class TestTenantGovernance(EditCases):
    """The settings page's decisions section: what happens to a call no rule decides, read-only tools, and
    how many calls run at once."""

    url_name = "console:tenant_settings"
    model = Tenant
    audit_verb = "tenant.governance_set"
    success_url = "console:tenant_settings"

    def object_of(self, tw):
        return tw.tenant

    def rows(self, tw):
        return list(Tenant.objects.filter(pk=tw.tenant.pk).values(*GOVERNANCE_FIELDS))

    def valid(self, world):
        return ({"section": "governance", "default_behavior": "deny", "max_parallel_calls": "3"},
                {"default_behavior": "deny", "auto_allow_read_only": False, "max_parallel_calls": 3})

    def invalid(self, world):
        valid = {"section": "governance", "default_behavior": "deny", "max_parallel_calls": "3"}
        return [({**valid, "max_parallel_calls": "0"}, "greater than or equal to 1"),
                ({**valid, "max_parallel_calls": "1001"}, "less than or equal to 1000"),
                ({**valid, "default_behavior": "maybe"}, "Select a valid choice")]

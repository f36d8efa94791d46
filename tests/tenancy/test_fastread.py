"""The hot path's plain reads: `fetch_one` gives the instance a queryset would, and `access_row` and
`key_sees_agent` answer as `access_object` and `key_sessions` do."""
import uuid

import pytest
from django.core.exceptions import ValidationError
from django.http import Http404

from tenancy.fastread import fetch_one
from tenancy.models import SYSTEM_AGENT, ApiKey
from tenancy.selectors import access_object, access_row, key_sees_agent, key_sessions
from tools.catalog.services import session_create
from tools.models import AgentSession, ToolCall

FIELDS_OF = {model: [field.attname for field in model._meta.concrete_fields]
             for model in (ApiKey, AgentSession, ToolCall)}


def same_values(found, expected, *, types: bool = True) -> None:
    for name in FIELDS_OF[type(expected)]:
        assert getattr(found, name) == getattr(expected, name), name
        if types:
            assert type(getattr(found, name)) is type(getattr(expected, name)), name


def test_a_row_comes_back_as_the_orm_reads_it(world):
    call = ToolCall.objects.for_tenant(world.a.tenant).get(pk=world.a.calls[0].pk)  # JSON, datetimes, UUIDs
    same_values(fetch_one(ToolCall, tenant=world.a.tenant.pk, pk=call.pk), call)
    session = AgentSession.objects.for_tenant(world.a.tenant).get(pk=world.a.session.pk)
    found = fetch_one(AgentSession, tenant=world.a.tenant, pk=str(session.pk))  # an instance, a string id
    same_values(found, session)
    assert found._state.adding is False and found._state.db == "default"


def test_a_joined_row_is_loaded_with_it(world, django_assert_num_queries):
    api_key = ApiKey.all_tenants.select_related("tenant").get(pk=world.a.key_objects["agent"].pk)
    with django_assert_num_queries(1):
        found = fetch_one(ApiKey, join="tenant", prefix=api_key.prefix)
        assert found.tenant.slug == "acme"
    same_values(found, api_key)
    assert found.tenant == world.a.tenant and found.tenant.max_parallel_calls == world.a.tenant.max_parallel_calls


def test_no_row_is_none_and_a_malformed_value_raises_as_a_filter_does(world):
    assert fetch_one(AgentSession, tenant=world.a.tenant.pk, pk=uuid.uuid4()) is None
    assert fetch_one(AgentSession, tenant=world.b.tenant.pk, pk=world.a.session.pk) is None  # another tenant's
    with pytest.raises(ValidationError):
        fetch_one(AgentSession, tenant=world.a.tenant.pk, pk="not-a-uuid")


def test_access_row_is_404_for_missing_foreign_malformed_and_refused_alike(world):
    tenant, session = world.a.tenant, world.a.session
    assert access_row(AgentSession, tenant, session.pk).pk == session.pk
    for pk in (uuid.uuid4(), "not-a-uuid", "", None):
        with pytest.raises(Http404):
            access_row(AgentSession, tenant, pk)
    with pytest.raises(Http404):
        access_row(AgentSession, world.b.tenant, session.pk)
    with pytest.raises(Http404):
        access_row(AgentSession, tenant, session.pk, allowed=lambda row: False)


@pytest.mark.parametrize("label", ["agent", "admin", "locked", "external"])
def test_key_sees_agent_agrees_with_key_sessions(world, label):
    tenant = world.a.tenant
    for agent in ("support-bot", "other-bot", "Support-Bot"):
        session_create(tenant=tenant, agent=agent, user="", api_key=None)
    AgentSession.objects.create(tenant=tenant, agent=SYSTEM_AGENT, user="", context={"system": True})
    api_key = world.a.key_objects[label]
    sessions = list(AgentSession.objects.for_tenant(tenant))
    seen = set(AgentSession.objects.for_tenant(tenant).filter(key_sessions(api_key)).values_list("pk", flat=True))
    assert {s.pk for s in sessions if key_sees_agent(api_key, s.agent)} == seen
    assert any(s.agent == SYSTEM_AGENT for s in sessions) and seen != set()
    for session in sessions:  # and access_object with the condition says the same
        try:
            access_object(AgentSession, tenant, session.pk, key_sessions(api_key))
            visible = True
        except Http404:
            visible = False
        assert visible == key_sees_agent(api_key, session.agent)


def test_insert_instance_writes_what_save_would(world):
    from django.db.models.signals import post_save, pre_save

    from tenancy.fastread import insert_instance

    session = world.a.session
    call = ToolCall(tenant=world.a.tenant, session=session, call_id="call_fast", tool_name="echo", input={"q": [1]})
    insert_instance(call)
    assert call._state.adding is False and call.created_at is not None
    stored = ToolCall.objects.for_tenant(world.a.tenant).get(pk=call.pk)
    same_values(stored, call, types=False)  # the new instance holds its defaults as declared (an enum member)
    assert stored.status == "received" and stored.input == {"q": [1]} and stored.event_seq == 0
    # Calls are inserted without the save machinery (tools.calls.submit): nothing may listen to their saves.
    assert not pre_save.has_listeners(ToolCall) and not post_save.has_listeners(ToolCall)

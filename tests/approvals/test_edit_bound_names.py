"""A reviewer's edit cannot set a bound argument under another spelling (case, width, composition): the
edit check and the pipeline refuse the same names, with the same function."""
import pytest

from approvals.models import ApprovalRequest, RequestStatus, Vote
from tests.approvals.conftest import console_api
from tools.calls.submit import calls_submit
from tools.catalog.services import binding_set
from tools.models import CallStatus, ToolCall

FULLWIDTH = str.maketrans({chr(c): chr(c + 0xFEE0) for c in range(0x21, 0x7F)})


@pytest.mark.parametrize("key", ["CWD", "Cwd", "cwd".translate(FULLWIDTH)])
def test_an_edit_naming_a_bound_argument_in_another_spelling_is_refused(world, gov_shell, gov_queue, gov_rule,
                                                                        gov_member, key):
    gov_rule("ask", gov_shell.name, queue=gov_queue(name="ops"))
    binding_set(tenant=world.a.tenant, tool=gov_shell.tool, name="cwd", value="/srv/app")
    [call] = calls_submit(session=world.a.session, calls=[{"name": gov_shell.name, "input": {"command": "ls"}}])
    assert call.status == CallStatus.AWAITING_APPROVAL, call.error
    request = ApprovalRequest.objects.for_tenant(world.a.tenant).get(call=call)
    response = console_api(gov_member(), world.a.tenant).post(
        f"/api/v1/approvals/{request.pk}/decide", {"decision": "edit", "input": {"command": "ls", key: "/"}},
        format="json")
    assert response.status_code == 400, response.content
    assert f"{key}: fixed by the server" in str(response.json()["error"]["fields"]["input"])
    request.refresh_from_db()
    assert request.status == RequestStatus.PENDING
    assert not Vote.objects.for_tenant(world.a.tenant).filter(request=request).exists()
    assert ToolCall.objects.for_tenant(world.a.tenant).get(pk=call.pk).status == CallStatus.AWAITING_APPROVAL

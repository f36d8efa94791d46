"""The inbox list shows each request's input, the one approving it would run (issue 36, point 8).

Shortened and expandable, escaped (an input is whatever the model sent), with invisible characters shown as
escapes; a standing reviewer edit is what the list, the request page's editor and the list's Approve all
work with. The keyboard's part is in test_inbox_keys_browser.py.
"""
import html
import json
import re

from django.urls import reverse

from approvals.models import ApprovalRequest, RequestStatus, Vote
from approvals.selectors import LINE_CHARS, LIST_INPUT_CHARS


def url(name, tenant, **kwargs):
    return reverse(f"inbox:{name}", kwargs={"tenant": tenant.slug, **kwargs})


def rows_of(page: str) -> dict[int, str]:
    """Each list row's HTML, by request id."""
    parts = re.split(r'(?=<tr class="selectable")', page)
    return {int(re.search(r'data-id="(\d+)"', part).group(1)): part.split("</tr>")[0]
            for part in parts if part.startswith('<tr class="selectable"')}


def posted_input(row: str) -> str:
    """What the row's Approve sends as the input."""
    found = re.search(r'<input type="hidden" name="input" value="([^"]*)">', row)
    assert found is not None, row
    return html.unescape(found.group(1))


def listing(client, tenant) -> dict[int, str]:
    response = client.get(url("inbox", tenant))
    assert response.status_code == 200
    return rows_of(response.content.decode())


def test_each_row_shows_its_input_escaped_and_shortened_when_long(world, inbox_pending):
    (hostile,) = inbox_pending(1, command="<script>alert(1)</script>")
    (long,) = inbox_pending(1, command="echo " + "x" * 300 + " END")
    (huge,) = inbox_pending(1, command="y" * LIST_INPUT_CHARS + " TAIL")
    rows = listing(world.a.console("reviewer"), world.a.tenant)

    row = rows[hostile.pk]
    assert '<code class="input-line" data-input-whole>{&quot;command&quot;: ' \
           '&quot;&lt;script&gt;alert(1)&lt;/script&gt;&quot;}</code>' in row
    assert "<script>alert" not in row
    assert json.loads(posted_input(row)) == {"command": "<script>alert(1)</script>"}

    row = rows[long.pk]
    line = re.search(r"<summary><code>(.*?)</code></summary>", row).group(1)
    assert html.unescape(line) == json.dumps({"command": "echo " + "x" * 300 + " END"})[:LINE_CHARS] + "…"
    folded = re.search(r"<pre data-input-whole>(.*?)</pre>", row, re.S).group(1)
    assert json.loads(html.unescape(folded)) == {"command": "echo " + "x" * 300 + " END"}  # all of it, unfolded
    assert json.loads(posted_input(row)) == {"command": "echo " + "x" * 300 + " END"}

    row = rows[huge.pk]  # too long for the list: its start, a link to read it all, and no Approve
    assert "TAIL" not in row and "data-input-whole" not in row and "quick-approve" not in row
    assert "too long for the list" in row and "{&quot;command&quot;: &quot;yyy" in row


def test_invisible_characters_in_an_input_show_as_escapes(world, inbox_pending):
    (pending,) = inbox_pending(1, command="cat \u202eexe.txt\u200b")
    row = listing(world.a.console("reviewer"), world.a.tenant)[pending.pk]
    assert "\u202e" not in row and "\u200b" not in row
    assert "cat \\u202eexe.txt\\u200b" in row
    assert json.loads(posted_input(row)) == {"command": "cat \u202eexe.txt\u200b"}  # the value itself


def test_a_standing_edit_is_the_input_the_list_and_the_request_page_show(world, inbox_pending, gov_queue):
    (pending,) = inbox_pending(1, queue=gov_queue(name="pair", required_approvals=2), command="rm -rf /srv")
    target = url("inbox_request", world.a.tenant, request_id=pending.pk)
    edited = world.a.console("operator").post(target, {"decision": "edit", "input": '{"command": "ls /srv"}'})
    assert edited.status_code == 302

    reviewer = world.a.console("reviewer")
    row = listing(reviewer, world.a.tenant)[pending.pk]
    assert ">edited</span>" in row and "ls /srv" in row and "rm -rf" not in row
    page = reviewer.get(target).content.decode()
    editor = re.search(r'<textarea name="input" id="id_input"[^>]*>(.*?)</textarea>', page, re.S).group(1)
    assert json.loads(html.unescape(editor)) == {"command": "ls /srv"}  # what approving runs
    assert 'id="edit-stands"' in page

    # The list's Approve sends the edit it showed: an approval of it, the second one needed.
    approved = reviewer.post(target, {"decision": "approve", "input": posted_input(row)})
    assert approved.status_code == 302
    request = ApprovalRequest.objects.for_tenant(world.a.tenant).select_related("call").get(pk=pending.pk)
    assert request.status == RequestStatus.APPROVED
    assert request.call.effective_input["command"] == "ls /srv"


def test_the_lists_approve_votes_for_the_input_it_showed_even_if_an_edit_came_since(world, inbox_pending,
                                                                                     gov_queue):
    (pending,) = inbox_pending(1, queue=gov_queue(name="pair", required_approvals=2), command="rm -rf /srv")
    reviewer = world.a.console("reviewer")
    row = listing(reviewer, world.a.tenant)[pending.pk]  # shows the model's input
    target = url("inbox_request", world.a.tenant, request_id=pending.pk)
    world.a.console("operator").post(target, {"decision": "edit", "input": '{"command": "rm -rf /"}'})

    assert reviewer.post(target, {"decision": "approve", "input": posted_input(row)}).status_code == 302
    vote = Vote.objects.for_tenant(world.a.tenant).filter(request=pending, reviewer=world.a.users["reviewer"]).get()
    # Not an approval of an edit the reviewer never saw: a vote for what the list showed.
    assert (vote.decision, vote.input) == ("edit", {"command": "rm -rf /srv"})
    assert ApprovalRequest.objects.for_tenant(world.a.tenant).get(pk=pending.pk).status == RequestStatus.PENDING

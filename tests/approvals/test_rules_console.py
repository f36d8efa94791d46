"""The rules page of the console: list, create/edit/delete (operators and admins), and the simulator."""
import json
import re

from django.urls import reverse

from approvals import selectors
from approvals.models import PermissionRule
from tools.catalog.services import binding_set


def url(name, tenant, **kwargs):
    return reverse(f"inbox:{name}", kwargs={"tenant": tenant.slug, **kwargs})


def text(response) -> str:
    return response.content.decode()


def rule_body(**values) -> dict:
    body = {"behavior": "ask", "tool_pattern": "mcp__github__*", "arg_match": "", "agents": "", "users": "",
            "queue": "", "priority": "0", "enabled": "on", "note": ""}
    body.update(values)
    return body


def test_rules_are_listed_in_evaluation_order(world, gov_rule, gov_queue):
    queue = gov_queue(name="security")
    allow = gov_rule("allow", "calculate", priority=50, note="maths is harmless")
    ask = gov_rule("ask", "shell", arg_match={"command": "git *"}, agents=["ops-bot"], users=["carol"], queue=queue)
    deny = gov_rule("deny", "shell", arg_match={"command": ["rm *", "dd *"]}, enabled=False)
    body = text(world.a.console("viewer").get(url("rule_list", world.a.tenant)))
    assert re.findall(r'id="rule-(\d+)"', body) == [str(deny.pk), str(ask.pk), str(allow.pk)]
    for expected in ("maths is harmless", "git *", "ops-bot", "carol", "security", "rm *"):
        assert expected in body
    assert 'class="disabled"' in body
    assert "New rule" not in body  # a viewer reads only


def test_an_operator_creates_edits_and_deletes_a_rule(world, gov_queue):
    queue = gov_queue(name="security")
    client = world.a.console("operator")
    tenant = world.a.tenant
    assert client.get(url("rule_create", tenant)).status_code == 200
    response = client.post(url("rule_create", tenant), rule_body(
        tool_pattern="shell", arg_match='{"command": "git push *"}', agents="ops-bot, deploy-bot\nops-bot",
        users="carol@example.com", queue=str(queue.pk), priority="5", note="pushes need a look"))
    assert response.status_code == 302, text(response)
    rule = PermissionRule.objects.for_tenant(tenant).get()
    assert (rule.behavior, rule.tool_pattern, rule.arg_match) == ("ask", "shell", {"command": "git push *"})
    assert (rule.agents, rule.users, rule.queue, rule.priority) == (["ops-bot", "deploy-bot"], ["carol@example.com"],
                                                                    queue, 5)
    assert rule.created_by == world.a.users["operator"]

    edit = client.get(url("rule_edit", tenant, rule_id=rule.pk))
    assert "git push *" in text(edit) and "ops-bot, deploy-bot" in text(edit)
    response = client.post(url("rule_edit", tenant, rule_id=rule.pk), rule_body(
        behavior="deny", tool_pattern="shell", arg_match="", agents="", enabled=""))
    assert response.status_code == 302
    rule.refresh_from_db()
    assert (rule.behavior, rule.arg_match, rule.agents, rule.enabled, rule.queue) == ("deny", {}, [], False, None)
    # The engine sees the change at once (the policy version moved).
    assert selectors.simulate(tenant=tenant, tool_name="shell", tool_input={}).behavior != "deny"  # disabled

    assert client.get(url("rule_delete", tenant, rule_id=rule.pk)).status_code == 200
    response = client.post(url("rule_delete", tenant, rule_id=rule.pk))
    assert response.status_code == 302
    assert not PermissionRule.objects.for_tenant(tenant).exists()


def test_the_simulator_shows_the_decision_its_rule_and_why(world, gov_rule):
    tenant = world.a.tenant
    ask = gov_rule("ask", "shell", arg_match={"command": "git *"}, note="git needs a look")
    client = world.a.console("reviewer")
    body = text(client.get(url("rule_list", tenant), {
        "tool": "shell", "input": json.dumps({"command": "git push origin"}), "agent": "ops-bot", "user": ""}))
    decision = body[body.index('id="decision"'):]
    assert 'class="tag b-ask"' in decision
    assert f'href="#rule-{ask.pk}">#{ask.pk}</a>' in decision
    assert "needs approval by rule #" in decision and "git needs a look" in decision
    # Whole words: `gitx` is not `git`; the tenant's default decides.
    body = text(client.get(url("rule_list", tenant), {"tool": "shell", "input": '{"command": "gitx"}'}))
    assert "no rule matched: the tenant&#x27;s default is allow" in body
    # Broken JSON is an error on the form, not a crash.
    response = client.get(url("rule_list", tenant), {"tool": "shell", "input": "{nope"})
    assert response.status_code == 200 and "not valid JSON" in text(response)


def test_the_simulator_applies_bound_arguments_like_a_real_call(world, gov_rule):
    tenant = world.a.tenant
    clock = world.a.tools["current_time"]
    deny = gov_rule("deny", "current_time", arg_match={"timezone": "Asia/*"}, note="no Asia")
    # world.a binds timezone=Asia/Tokyo for support-bot: whatever the model sends, the deny rule matches.
    assert world.a.binding.tool == clock
    client = world.a.console("reviewer")
    body = text(client.get(url("rule_list", tenant), {
        "tool": "current_time", "input": '{"timezone": "Europe/Berlin"}', "agent": "support-bot"}))
    decision = body[body.index('id="decision"'):]
    assert 'class="tag b-deny"' in decision and f"#{deny.pk}" in decision
    other = text(client.get(url("rule_list", tenant), {
        "tool": "current_time", "input": '{"timezone": "Europe/Berlin"}', "agent": "other-bot"}))
    assert 'class="tag b-allow"' in other[other.index('id="decision"'):]
    # The API endpoint and the console agree: one selector behind both.
    api = world.a.client("admin").post("/api/v1/rules/evaluate", {
        "tool": "current_time", "input": {"timezone": "Europe/Berlin"}, "agent": "support-bot"}, format="json")
    assert api.status_code == 200
    assert api.json() == selectors.simulate(tenant=tenant, tool_name="current_time",
                                            tool_input={"timezone": "Europe/Berlin"}, agent="support-bot").as_dict()
    assert api.json()["rule"] == deny.pk
    binding_set(tenant=tenant, tool=clock, name="timezone", value="UTC", agent="support-bot")
    assert selectors.simulate(tenant=tenant, tool_name="current_time", tool_input={},
                              agent="support-bot").behavior == "allow"


def considered_rows(body: str) -> dict[int, str]:
    table = body.split('id="rules-considered"', 1)[1].split("</table>", 1)[0]
    return {int(m.group(1)): m.group(2) for m in re.finditer(r'<tr data-considered="(\d+)">(.*?)</tr>', table, re.S)}


def test_the_simulator_lists_each_rule_it_considered_and_why_it_did_or_did_not_match(world, gov_rule):
    tenant = world.a.tenant
    deny_rm = gov_rule("deny", "shell", arg_match={"command": "rm *"})
    other_tool = gov_rule("deny", "calculate")
    for_another_agent = gov_rule("ask", "shell", agents=["deploy-bot"])
    ask_git = gov_rule("ask", "shell", arg_match={"command": "git *"})
    also_matching = gov_rule("ask", "sh*", priority=-5)
    body = text(world.a.console("viewer").get(url("rule_list", tenant), {
        "tool": "shell", "input": json.dumps({"command": "git push"}), "agent": "ops-bot"}))
    rows = considered_rows(body)
    assert list(rows)[:2] == [deny_rm.pk, other_tool.pk]  # deny rules are tried first
    assert "No, because the call fails the condition “" in rows[deny_rm.pk] and "rm *" in rows[deny_rm.pk]
    assert "No, because the tool is not &#x27;calculate&#x27;." in rows[other_tool.pk]
    assert "No, because the agent is not deploy-bot." in rows[for_another_agent.pk]
    assert "<strong>Yes, and it decides.</strong>" in rows[ask_git.pk]
    assert "Yes, but a rule tried before it decides." in rows[also_matching.pk]
    assert sum("Yes, and it decides." in row for row in rows.values()) == 1


def test_a_pattern_that_matches_no_tool_is_saved_with_a_warning_and_a_suggestion(world):
    client = world.a.console("operator")
    response = client.post(url("rule_create", world.a.tenant), rule_body(tool_pattern="calcuate"), follow=True)
    assert response.status_code == 200
    page = text(response)
    assert "The tool pattern &#x27;calcuate&#x27; matches none of the tools now: did you mean calculate?" in page
    rule = PermissionRule.objects.for_tenant(world.a.tenant).get(tool_pattern="calcuate")
    row = page[page.index(f'id="rule-{rule.pk}"'):]
    row = row[:row.index("</tr>")]
    assert "matches no tool: did you mean <code>calculate</code>?" in row
    # A pattern that matches is saved without either.
    response = client.post(url("rule_create", world.a.tenant), rule_body(tool_pattern="calc*"), follow=True)
    matching = PermissionRule.objects.for_tenant(world.a.tenant).get(tool_pattern="calc*")
    page = text(response)
    assert "matches none of the tools" not in page
    row = page[page.index(f'id="rule-{matching.pk}"'):]
    assert "matches no tool" not in row[:row.index("</tr>")]

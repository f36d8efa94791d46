"""After-execution steps (tools.calls.aftercare.RESULT_STEPS): redaction by tenant rules, the result cap and
retries of transient errors, each visible on the call's timeline. Calls go through the API and really run on
the local executor, so these tests are transactional."""
import json

import pytest
from django.test import override_settings

from tests.tools.support import events_of, poll, submit, wait_status, wait_terminal
from tools.calls import aftercare
from tools.calls.runtime import runtime
from tools.calls.submit import calls_submit
from tools.catalog.services import session_create, tool_update
from tools.models import CallStatus, EventKind, Tool, ToolCall
from tools.python.decorators import ToolError
from tools.python.results import tool_result
from tools.redaction.rules import Redaction, pattern_compile, tool_pattern_matches

pytestmark = [pytest.mark.django_db(transaction=True), pytest.mark.usefixtures("drain_calls")]

EMAIL = "alice.smith@example.com"
CARD = "4111 1111 1111 1111"


@pytest.fixture
def session(world):
    return session_create(tenant=world.a.tenant, agent="after-steps")


def add_rule(world, **body):
    response = world.a.client("admin").post("/api/v1/redaction-rules", body, format="json")
    assert response.status_code == 201, response.content
    return response.json()


def run(world, session, tool: Tool, arguments: dict | None = None) -> tuple[dict, ToolCall]:
    """Submit one call through the API; the call as the model-facing API returns it once settled, and its row."""
    client = world.a.client()
    [call] = submit(client, session, {"name": tool.name, "input": arguments or {}})
    row = wait_terminal(call["id"], tenant=world.a.tenant)
    return client.get(f"/api/v1/calls/{call['id']}").json(), row


def step_events(world, call_id: str, step: str) -> list[dict]:
    return [e["data"] for e in events_of(world.a.client(), call_id)
            if e["kind"] == EventKind.LOG and e["data"].get("step") == step]


# --- redaction -----------------------------------------------------------------------------------

@pytest.fixture
def profile_tool(make_tool):
    def profile(who: str) -> dict:
        """A person's profile, with what a model must not see.

        Args:
            who: "both" for an e-mail and a card number, "email" for the e-mail only.
        """
        found = {"name": "Alice", "contact": {"email": EMAIL}, "notes": [f"write to {EMAIL}"]}
        if who == "both":
            found["card"] = CARD
        return found

    return make_tool(profile)


@pytest.fixture
def rules(world):
    return [add_rule(world, name="emails", pattern=r"[\w.]+@[\w.]+\.\w+", replacement="[email]", keep_original=True),
            add_rule(world, name="cards", pattern=r"\d{4}(?: \d{4}){3}", replacement="[card]")]


def test_redaction_of_text_and_structured_results_is_on_the_timeline_and_keeps_the_original_only_when_allowed(
        world, session, profile_tool, rules):
    both, both_row = run(world, session, profile_tool, {"who": "both"})
    assert both["status"] == "succeeded"
    seen = json.dumps(both)
    assert EMAIL not in seen and CARD not in seen  # neither text nor structured part carries them
    assert both["result"]["structured"] == {"name": "Alice", "contact": {"email": "[email]"},
                                            "notes": ["write to [email]"], "card": "[card]"}
    assert "[email]" in both["result"]["content"][0]["text"] and "[card]" in both["result"]["content"][0]["text"]
    [effect] = step_events(world, both["id"], "redact")
    assert effect == {"step": "redact", "original_kept": False,
                      "rules": [{"rule": "cards", "replacements": 2}, {"rule": "emails", "replacements": 4}]}
    assert both_row.unredacted_result is None  # a rule that matched does not allow keeping it
    timeline = json.dumps(events_of(world.a.client(), both["id"]))
    assert EMAIL not in timeline and CARD not in timeline

    only_email, email_row = run(world, session, profile_tool, {"who": "email"})
    assert EMAIL not in json.dumps(only_email)
    [effect] = step_events(world, only_email["id"], "redact")
    assert effect["original_kept"] is True and effect["rules"] == [{"rule": "emails", "replacements": 4}]
    assert email_row.unredacted_result["structured"]["contact"] == {"email": EMAIL}


def test_the_console_shows_a_kept_original_to_admins_only(world, session, profile_tool, rules):
    call, _ = run(world, session, profile_tool, {"who": "email"})
    url = f"/t/{world.a.tenant.slug}/calls/{call['id']}/"
    admin_page = world.a.console("admin").get(url).content.decode()
    assert EMAIL in admin_page and "Unredacted result" in admin_page
    for role in ("operator", "viewer"):
        page = world.a.console(role).get(url)
        assert page.status_code == 200
        assert EMAIL not in page.content.decode()


def test_rules_apply_to_the_tools_their_pattern_names_and_to_error_messages(world, session, make_tool):
    def leaky(fail: bool) -> str:
        """Say a secret, or fail with it.

        Args:
            fail: Whether to fail.
        """
        if fail:
            raise ToolError("token tk_live_12345 refused", error_type="Refused")
        return "token tk_live_12345"

    tool = make_tool(leaky)
    other = make_tool(leaky, prefix="elsewhere")
    add_rule(world, name="tokens", pattern=r"tk_live_\w+", tool_pattern="leaky_*")
    ok, _ = run(world, session, tool, {"fail": False})
    assert ok["result"]["content"][0]["text"] == "token [redacted]"
    failed, row = run(world, session, tool, {"fail": True})
    assert failed["status"] == "failed" and failed["error"]["error"] == "token [redacted] refused"
    assert "tk_live" not in json.dumps(failed) and row.unredacted_result is None
    untouched, _ = run(world, session, other, {"fail": False})
    assert untouched["result"]["content"][0]["text"] == "token tk_live_12345"
    assert not step_events(world, untouched["id"], "redact")


def test_a_backtracking_pattern_stays_linear(world, session, make_tool):
    def many_as() -> str:
        """A long run of a's that does not end as the pattern wants."""
        return "a" * 90_000 + "!"

    tool = make_tool(many_as)
    add_rule(world, name="nested", pattern=r"(a+)+$")  # exponential for a backtracking engine
    call, _ = run(world, session, tool)
    assert call["status"] == "succeeded" and call["result"]["content"][0]["text"].endswith("!")


@pytest.mark.parametrize(("body", "field"), [
    ({"name": "backref", "pattern": r"(a)\1"}, "pattern"),
    ({"name": "lookahead", "pattern": r"a(?=b)"}, "pattern"),
    ({"name": "empty", "pattern": r"x*"}, "pattern"),
    ({"name": "long", "pattern": "a" * 501}, "pattern"),
    ({"name": "spaced", "pattern": "a", "tool_pattern": "two words"}, "tool_pattern"),
])
def test_an_invalid_rule_is_a_400_with_its_field(world, body, field):
    response = world.a.client("admin").post("/api/v1/redaction-rules", body, format="json")
    assert response.status_code == 400, response.content
    assert field in response.json()["error"]["fields"]


def test_rules_are_admin_only_and_audited_without_results(world):
    assert world.a.client("agent").get("/api/v1/redaction-rules").status_code == 403
    rule = add_rule(world, name="emails", pattern=r"\S+@\S+")
    patched = world.a.client("admin").patch(f"/api/v1/redaction-rules/{rule['id']}", {"enabled": False},
                                            format="json")
    assert patched.status_code == 200 and patched.json()["enabled"] is False
    from audit.models import Event
    verbs = list(Event.objects.for_tenant(world.a.tenant).filter(target="redaction_rule:emails").values_list(
        "verb", flat=True).order_by("id"))
    assert verbs == ["redaction_rule.created", "redaction_rule.updated"]


# --- the cap -------------------------------------------------------------------------------------

@override_settings(TOOLKEEPER_MAX_RESULT_CHARS=150)
def test_a_long_result_is_cut_with_a_note_and_the_tools_own_cap_beats_the_platforms(world, session, make_tool):
    def long_text() -> str:
        """Five hundred characters."""
        return "x" * 500

    def big_structure() -> dict:
        """A structure larger than the cap."""
        return {"rows": list(range(100))}

    own = make_tool(long_text, prefix="own_cap")
    tool_update(tool=own, max_result_chars=300)
    platform = make_tool(long_text, prefix="platform_cap")
    structure = make_tool(big_structure)

    call, _ = run(world, session, own)
    [block] = call["result"]["content"]
    assert block["text"] == "x" * 300 + "\n[truncated: the result had 500 characters; the first 300 are shown]"
    assert step_events(world, call["id"], "cap") == [{"step": "cap", "cap": 300, "chars": 500}]

    call, _ = run(world, session, platform)
    assert call["result"]["content"][0]["text"].startswith("x" * 150 + "\n[truncated: the result had 500 ")

    call, _ = run(world, session, structure)
    assert call["result"]["structured"] is None
    text = call["result"]["content"][0]["text"]
    assert len(text.split("\n")[0]) == 150 and "[the structured part had" in text
    [effect] = step_events(world, call["id"], "cap")
    assert effect["structured_chars"] > 150


def test_a_small_result_passes_unchanged_without_events(world, session, make_tool):
    def small() -> str:
        """Short."""
        return "short"

    call, _ = run(world, session, make_tool(small))
    assert call["result"]["content"] == [{"type": "text", "text": "short"}]
    assert {e["kind"] for e in events_of(world.a.client(), call["id"])} == {"status"}


def test_the_steps_of_a_dispatched_call_read_nothing_more_from_the_database(
        world, session, make_tool, django_assert_num_queries):
    def small() -> str:
        """Short."""
        return "short"

    tool = make_tool(small)
    add_rule(world, name="elsewhere", pattern=r"\d+", tool_pattern="other_*")
    [call] = calls_submit(session=session, calls=[{"name": tool.name, "input": {}}])
    assert call.result_rules == ()  # the chain prepared them from the catalog version it read
    outcome = aftercare.Outcome(call=call, tool=call.tool, result=tool_result("short 123"))
    with django_assert_num_queries(0):
        aftercare.result_steps_run(outcome)
    assert outcome.result["content"] == [{"type": "text", "text": "short 123"}] and not outcome.effects


# --- retries -------------------------------------------------------------------------------------

def flaky(failures: int, **error):
    """A tool that fails `failures` times with ToolError(**error), then succeeds; `runs` counts its runs."""
    runs = []

    def flaky_tool() -> str:
        """Fail, then succeed."""
        runs.append(1)
        if len(runs) <= failures:
            raise ToolError(f"attempt {len(runs)} failed", **error)
        return f"ok after {len(runs)}"

    flaky_tool.runs = runs
    return flaky_tool


def test_an_idempotent_tool_is_retried_after_transient_errors_with_backoff(world, session, make_tool):
    tool = make_tool(flaky(2, transient=True), prefix="flaky", idempotent=True)
    tool_update(tool=tool, retry_max=2, retry_backoff_s=0.01)
    call, row = run(world, session, tool)
    assert call["status"] == "succeeded" and call["result"]["content"][0]["text"] == "ok after 3"
    assert row.attempts == 3
    assert step_events(world, call["id"], "retry") == [
        {"step": "retry", "attempt": 2, "after_s": 0.01, "error": "ToolError: attempt 1 failed"},
        {"step": "retry", "attempt": 3, "after_s": 0.02, "error": "ToolError: attempt 2 failed"},
    ]


def test_retries_end_at_retry_max(world, session, make_tool):
    tool = make_tool(flaky(5, error_type="Unavailable"), prefix="down", idempotent=True)
    tool_update(tool=tool, retry_max=1, retry_backoff_s=0)
    call, row = run(world, session, tool)
    assert call["status"] == "failed" and call["error"]["error"] == "attempt 2 failed"
    assert row.attempts == 2 and len(step_events(world, call["id"], "retry")) == 1


@pytest.mark.parametrize("case", ["not idempotent", "not transient"])
def test_no_retry_for_a_tool_that_is_not_idempotent_or_an_error_that_is_not_transient(
        world, session, make_tool, case):
    error = {"transient": True} if case == "not idempotent" else {"error_type": "Refused"}
    fn = flaky(1, **error)
    tool = make_tool(fn, prefix="once", idempotent=case != "not idempotent")
    Tool.objects.for_tenant(world.a.tenant).filter(pk=tool.pk).update(retry_max=3, retry_backoff_s=0)
    call, row = run(world, session, tool)
    assert call["status"] == "failed" and row.attempts == 1 and len(fn.runs) == 1
    assert not step_events(world, call["id"], "retry")


def test_retry_settings_are_bounded_and_for_idempotent_tools_only(world, make_tool):
    admin = world.a.client("admin")
    plain = make_tool(flaky(0), prefix="plain")
    safe = make_tool(flaky(0), prefix="safe", idempotent=True)
    for tool, body, field in ((plain, {"retry_max": 1}, "retry_max"), (safe, {"retry_max": 11}, "retry_max"),
                              (safe, {"retry_backoff_s": -1}, "retry_backoff_s"),
                              (safe, {"max_result_chars": 10}, "max_result_chars")):
        response = admin.patch(f"/api/v1/tools/{tool.pk}", body, format="json")
        assert response.status_code == 400 and field in response.json()["error"]["fields"], response.content
    response = admin.patch(f"/api/v1/tools/{safe.pk}", {"retry_max": 2, "retry_backoff_s": 1.5,
                                                        "max_result_chars": None}, format="json")
    assert response.status_code == 200, response.content
    assert {k: response.json()[k] for k in ("retry_max", "retry_backoff_s", "max_result_chars")} == {
        "retry_max": 2, "retry_backoff_s": 1.5, "max_result_chars": None}


def test_a_cancel_during_the_backoff_stops_the_retries(world, session, make_tool):
    fn = flaky(5, transient=True)
    tool = make_tool(fn, prefix="slow_retry", idempotent=True)
    tool_update(tool=tool, retry_max=3, retry_backoff_s=20)  # within the tool's 30 s timeout
    client = world.a.client()
    [call] = submit(client, session, {"name": tool.name, "input": {}})
    poll(lambda: step_events(world, call["id"], "retry"), message="the first retry to be announced")
    assert client.post(f"/api/v1/calls/{call['id']}/cancel").status_code == 200
    executor = runtime().executor
    poll(lambda: call["id"] not in executor._running, message="the executor to let the call go")
    row = wait_status(call["id"], CallStatus.INTERRUPTED, tenant=world.a.tenant)
    assert row.attempts == 1 and len(fn.runs) == 1


def test_a_retry_event_does_not_carry_what_redaction_removes(world, session, make_tool):
    fn = flaky(1, transient=True)

    def secretive() -> str:
        """Fail once saying a secret."""
        try:
            return fn()
        except ToolError as exc:
            raise ToolError(f"{exc} for tk_live_999", transient=True) from None

    tool = make_tool(secretive, idempotent=True)
    tool_update(tool=tool, retry_max=1, retry_backoff_s=0)
    add_rule(world, name="tokens", pattern=r"tk_live_\w+")
    call, _ = run(world, session, tool)
    assert call["status"] == "succeeded"
    [retry] = step_events(world, call["id"], "retry")
    assert retry["error"] == "ToolError: attempt 1 failed for [redacted]"


# --- the chain from settings ---------------------------------------------------------------------

class Shout(aftercare.ResultStep):
    """Upper-cases the text."""

    name = "shout"

    def process(self, outcome):
        if outcome.result is not None:
            outcome.result = {**outcome.result, "content": [
                {**b, "text": b["text"].upper()} for b in outcome.result["content"]]}
            outcome.note(self.name)


class RefuseSecret(aftercare.ResultStep):
    """Settles the call as failed when the text says SECRET."""

    name = "refuse"

    def process(self, outcome):
        if outcome.result is not None and "SECRET" in json.dumps(outcome.result):
            outcome.fail("Refused", "the result said a secret")
            outcome.note(self.name)


@pytest.mark.parametrize(("order", "status"), [(("Shout", "RefuseSecret"), "failed"),
                                               (("RefuseSecret", "Shout"), "succeeded")])
def test_custom_steps_transform_and_settle_in_the_chains_order(world, session, make_tool, order, status):
    def whisper() -> str:
        """Say a secret quietly."""
        return "a secret"

    tool = make_tool(whisper)
    with aftercare.RESULT_STEPS.replaced([globals()[name] for name in order]):
        call, _ = run(world, session, tool)
    assert call["status"] == status
    if status == "failed":
        assert (call["error"]["errorType"], call["error"]["error"]) == ("Refused", "the result said a secret")
        assert [e["step"] for e in step_events(world, call["id"], "shout") + step_events(
            world, call["id"], "refuse")] == ["shout", "refuse"]
    else:
        assert call["result"]["content"][0]["text"] == "A SECRET"


# --- units ---------------------------------------------------------------------------------------

def test_tool_patterns_match_whole_names():
    assert tool_pattern_matches("*", "anything")
    assert tool_pattern_matches("mcp__crm__*", "mcp__crm__find")
    assert not tool_pattern_matches("mcp__crm__*", "mcp__crmx__find")
    assert tool_pattern_matches("a*b*c", "a-b-b-c") and not tool_pattern_matches("a*b*c", "a-c-b")
    assert not tool_pattern_matches("lookup", "lookup_all")


def test_redaction_keeps_keys_apart_and_replaces_literally():
    redaction = Redaction((aftercare_rule(r"\d+", r"\1#"),))
    assert redaction.value({"a1": 1, "a2": "x 22"}) == {"a\\1#": 1, "a\\1##": "x \\1#"}
    assert redaction.counts == {"numbers": 3}


def aftercare_rule(pattern: str, replacement: str):
    from tools.redaction.rules import CompiledRule

    return CompiledRule(name="numbers", regex=pattern_compile(pattern), replacement=replacement, tool_pattern="*",
                        keep_original=False)

"""The reviewer's inbox, external tasks, the rules page (with the simulator) and the queues page.

Thin views over approvals.selectors (reads) and approvals.services (writes). Every page goes through
`tenancy.web.tenant_view`: the tenant (membership required) and every object the URL names are resolved
first (404 when missing or another tenant's), then the role. Deciding needs a reviewing role (reviewer,
operator, admin); rules and queues are changed by operators and admins, through the generic views of
`tenancy.editing` declared here.
"""
import json

from django.contrib import messages
from django.core.exceptions import PermissionDenied
from django.db.models import Case, IntegerField, Prefetch, Q, Value, When
from django.http import Http404, HttpResponse
from django.shortcuts import redirect, render
from django.urls import reverse
from django.utils.http import url_has_allowed_host_and_scheme
from django.views.decorators.csrf import csrf_exempt
from django.views.decorators.http import require_POST

from approvals import decision_links, grants, notifications, selectors, services, slack
from approvals.channel_kinds import reviewer_kind_names
from approvals.forms import (
    BulkDecisionForm,
    ChannelForm,
    DecisionForm,
    ExternalResultForm,
    InboxFilterForm,
    QueueForm,
    ReviewerNotifyForm,
    RuleForm,
    SimulatorForm,
)
from approvals.grants import DURATION_CHOICES
from approvals.models import (
    ApprovalRequest,
    DeliveryStatus,
    Notification,
    NotificationChannel,
    NotifyEvent,
    PermissionRule,
    Queue,
    RequestStatus,
    ReviewerNotifySetting,
    Vote,
    VoteDecision,
)
from common.errors import Conflict, NotPermitted
from tenancy.editing import ObjectDeleteView, ObjectFormView, secrets_not_kept
from tenancy.web import (
    INVALID_STATUS,
    MEMBER,
    OPERATE,
    SERVICE_REFUSALS,
    acting_user,
    add_service_errors,
    page_of,
    service_messages,
    tenant_redirect,
    tenant_view,
)
from tools.catalog.declared import call_exposed

BEHAVIOR_ORDER = Case(When(behavior="deny", then=Value(0)), When(behavior="ask", then=Value(1)),
                      When(behavior="confirm", then=Value(2)), default=Value(3), output_field=IntegerField())


def _require_reviewer(request) -> None:
    if not request.membership.can_review:
        raise PermissionDenied("Only reviewers, operators and admins decide.")


def _votes(tenant):
    return Prefetch("votes", queryset=Vote.objects.for_tenant(tenant).order_by("at", "id"))


def _tabs(request) -> dict:
    return {
        "pending_count": selectors.inbox_count(tenant=request.tenant),
        "external_count": selectors.external_tasks(tenant=request.tenant).count(),
    }


def _filtered(request, *, statuses, offered_from):
    """The filter form of the query string (offering what exists among requests in `offered_from`), the
    filters it chose, and the requests in `statuses` they leave, as list rows."""
    tenant = request.tenant
    form = InboxFilterForm(request.GET or None,
                           choices=selectors.inbox_filter_choices(tenant=tenant, statuses=offered_from))
    filters = form.filters()
    requests = selectors.inbox_requests(tenant=tenant, statuses=statuses, **filters)
    return form, filters, selectors.request_rows(requests, tenant=tenant)


# --- the inbox ---------------------------------------------------------------------------------

@tenant_view(methods=("GET", "POST"), write=MEMBER)
def inbox(request):
    """The pending requests. A POST (reviewers only) approves or rejects the rows ticked, each on its own."""
    bulk, status = None, 200
    if request.method == "POST":
        _require_reviewer(request)
        bulk = BulkDecisionForm(request.POST)
        if bulk.is_valid():
            data = bulk.cleaned_data
            try:
                outcome = services.requests_decide_bulk(
                    tenant=request.tenant, request_ids=data["ids"], reviewer=request.user,
                    decision=data["decision"], message=data["message"], seen=data["seen"])
            except SERVICE_REFUSALS as exc:
                add_service_errors(bulk, exc)
            else:
                _bulk_messages(request, outcome, data["decision"])
                return redirect(_list_url(request))
        status = INVALID_STATUS
    pending = [RequestStatus.PENDING]
    form, filters, requests = _filtered(request, statuses=pending, offered_from=pending)
    page = page_of(request, selectors.with_shown_input(requests, tenant=request.tenant))
    may_decide = request.membership.can_review
    refusals = services.decide_refusals(requests=page, user=request.user) if may_decide else {}
    if bulk is not None:  # a refused post: the rows stay ticked
        ticked = {str(value) for value in request.POST.getlist("ids")}
        ticked = {item.pk for item in page if str(item.pk) in ticked}
    else:
        ticked = {item.pk for item in page} if request.GET.get("select") == "all" else set()
    every = request.GET.copy()
    every["select"] = "all"
    return render(request, "inbox/inbox.html", {
        "form": form, "filters": filters, "page": page, "tab": "pending",
        # Each row shows the input approving it would run; its Approve sends that input back (an input that
        # changed meanwhile makes the vote an edit to what the reviewer saw: `DecisionForm`).
        "rows": [(item, selectors.shown_input(item), refusals.get(item.pk)) for item in page],
        "may_decide": may_decide, "return_to": _list_url(request), **_tabs(request),
        "bulk": bulk or BulkDecisionForm(), "ticked": ticked, "select_all_query": every.urlencode(),
        "bulk_max": services.BULK_MAX,
    }, status=status)


def _list_url(request) -> str:
    """This list, with its filters and page, without the "select all" of its query."""
    query = request.GET.copy()
    query.pop("select", None)
    return request.path + (f"?{query.urlencode()}" if query else "")


def _request_label(approval) -> str:
    """A request in a bulk decision's messages: its number first (call ids repeat across sessions)."""
    return f"#{approval.pk} {approval.tool_name} ({approval.call.call_id})"


def _bulk_messages(request, outcome, decision: str) -> None:
    """What a bulk decision did: the requests settled, those that wait for more approvals, and each one skipped
    with its reason (every text escaped by the template)."""
    settled = [a for a in outcome.decided if a.status != RequestStatus.PENDING]
    voted = [a for a in outcome.decided if a.status == RequestStatus.PENDING]
    verb = "Approved" if decision == VoteDecision.APPROVE else "Rejected"
    if settled:
        messages.success(request, f"{verb} {len(settled)}: {', '.join(_request_label(a) for a in settled)}.")
    if voted:
        messages.success(request, f"Your vote is recorded on {len(voted)}, which wait for more approvals: "
                                  f"{', '.join(_request_label(a) for a in voted)}.")
    for skipped in outcome.skipped:
        what = _request_label(skipped.request) if skipped.request is not None else f"request {skipped.id}"
        messages.warning(request, f"Skipped {what}: {skipped.reason}.")
    if not outcome.decided and not outcome.skipped:
        messages.info(request, "Nothing was selected.")


@tenant_view()
def inbox_history(request):
    status = request.GET.get("status", "")
    statuses = [status] if status in selectors.DECIDED_STATUSES else selectors.DECIDED_STATUSES
    form, filters, requests = _filtered(request, statuses=statuses, offered_from=selectors.DECIDED_STATUSES)
    if status in selectors.DECIDED_STATUSES:
        filters["status"] = status
    return render(request, "inbox/history.html", {
        "form": form, "filters": filters, "page": page_of(request, requests), "tab": "history",
        "statuses": selectors.DECIDED_STATUSES, "status": status, **_tabs(request),
    })


def _next_after(request, approval):
    """Where a reviewer goes after deciding: the next pending request they have not voted on, else the list."""
    return_to = request.POST.get("return_to", "")
    if return_to and url_has_allowed_host_and_scheme(return_to, allowed_hosts={request.get_host()}) \
            and return_to.startswith(reverse("inbox:inbox", kwargs={"tenant": request.tenant.slug})):
        return redirect(return_to)
    following = (selectors.inbox_requests(tenant=request.tenant).exclude(pk=approval.pk)
                 .exclude(votes__reviewer=request.user).select_related(None).only("pk").first())
    if following is not None:
        return tenant_redirect(request, "inbox:inbox_request", request_id=following.pk)
    return tenant_redirect(request, "inbox:inbox")


def _decided_message(approval, decision: str) -> str:
    verbs = {VoteDecision.APPROVE: "approved", VoteDecision.EDIT: "approved with your edit",
             VoteDecision.REJECT: "rejected", VoteDecision.RESPOND: "answered"}
    text = f"{approval.tool_name} ({approval.call.call_id}): {verbs[decision]}."
    if approval.status == RequestStatus.PENDING:
        text = f"{approval.tool_name} ({approval.call.call_id}): your vote is recorded; more approvals are needed."
    return text


@tenant_view(methods=("GET", "POST"), write=MEMBER)
def inbox_request(request, approval):
    tenant = request.tenant
    approval = (ApprovalRequest.objects.for_tenant(tenant)
                .select_related("queue", "rule", "call__session", "call__tool")
                .prefetch_related(_votes(tenant)).get(pk=approval.pk))
    call = approval.call
    status = 200
    # What approving runs: a reviewer's edit that stands, else the model's input. The editor starts with it,
    # so that approving "as shown" approves what the reviewer read.
    standing = selectors.approved_edit(approval)
    runs = call.input if standing is None else standing
    shown_input = json.dumps(runs, indent=2, ensure_ascii=False)
    if request.method == "POST":
        _require_reviewer(request)
        posted = request.POST.copy()
        if not posted.get("input", "").strip():
            # A post without an input approves what would run: a refused decision shows it.
            posted["input"] = shown_input
        form = DecisionForm(posted, original_input=runs)
        status = INVALID_STATUS
        if form.is_valid():
            data = form.cleaned_data
            decision = data["decision"]
            try:
                settled = services.request_decide(request=approval, reviewer=request.user, decision=decision,
                                                  new_input=data["new_input"], message=data["message"].strip(),
                                                  grant=form.grant())
            except NotPermitted as exc:
                form.add_error(None, exc.message)
                status = 403
            except Conflict as exc:
                form.add_error(None, f"Your decision was not recorded: {exc.message}. "
                                     "Someone else may have decided first; the page now shows where it stands.")
                status = 409
            except SERVICE_REFUSALS as exc:
                add_service_errors(form, exc)
            else:
                messages.success(request, _decided_message(settled, decision))
                _grant_message(request, settled)
                if data["add_rule"] and decision in (VoteDecision.APPROVE, VoteDecision.EDIT):
                    _add_suggested_rule(request, approval, narrow=data["narrow_to_input"])
                return _next_after(request, approval)
        approval = (ApprovalRequest.objects.for_tenant(tenant)
                    .select_related("queue", "rule", "call__session", "call__tool")
                    .prefetch_related(_votes(tenant)).get(pk=approval.pk))
        call = approval.call
    else:
        form = DecisionForm(initial={"input": shown_input, "grant_pattern": json.dumps(
            services.grant_pattern_prefill(approval), indent=2, ensure_ascii=False)}, original_input=runs)
    pending = approval.status == RequestStatus.PENDING
    exposed = call_exposed(call.session, call) if pending else None
    queue = approval.queue
    # A reviewer who cannot decide it (another queue's, four-eyes, a vote already cast) is told so up front.
    reviewing = pending and request.membership.can_review
    refusal = services.decide_refusals(requests=[approval], user=request.user).get(approval.pk) if reviewing else None
    return render(request, "inbox/request.html", {
        "approval": approval, "call": call, "session": call.session, "tool": call.tool, "form": form,
        "schema": exposed.schema if exposed is not None else (call.tool.input_schema if call.tool else None),
        "votes": list(approval.votes.all()),
        # Approvals of the input that would run now (an edit restarts the count).
        "counted": len(selectors.approvals_of(approval, selectors.approved_edit(approval))),
        "required": queue.required_approvals if queue else 1,
        "may_decide": reviewing and refusal is None, "refusal": refusal, "edit_stands": standing is not None,
        "may_add_rule": request.membership.can_operate and services.rule_suggestion_blocked_by(approval) is None,
        "position": _position(tenant, approval), "tab": "pending", **_tabs(request),
        "grant_durations": DURATION_CHOICES, "request_grants": list(approval.grants.all()),
    }, status=status)


def _grant_message(request, approval) -> None:
    for grant in approval.grants.all():
        messages.success(request, f"Grant #{grant.pk}: {grants.describe(grant)}.")


def _position(tenant, approval) -> dict | None:
    """Where this request stands in the pending list (oldest first), and the one after it."""
    if approval.status != RequestStatus.PENDING:
        return None
    pending = selectors.inbox_requests(tenant=tenant).select_related(None).only("pk")
    earlier = Q(opened_at__lt=approval.opened_at) | Q(opened_at=approval.opened_at, id__lt=approval.pk)
    later = Q(opened_at__gt=approval.opened_at) | Q(opened_at=approval.opened_at, id__gt=approval.pk)
    return {"number": pending.filter(earlier).count() + 1, "next": pending.filter(later).first()}


def _add_suggested_rule(request, approval, *, narrow: bool) -> None:
    if not request.membership.can_operate:
        messages.warning(request, "Only operators and admins add rules: the suggested rule was not added.")
        return
    try:
        rule = services.rule_from_approval(request=approval, actor=acting_user(request), narrow_to_input=narrow)
    except SERVICE_REFUSALS as exc:
        messages.error(request, "The suggested rule was not added: " + "; ".join(service_messages(exc)))
    else:
        messages.success(request, f"Rule #{rule.pk} added: always allow {rule.tool_pattern} for "
                                  f"{', '.join(rule.agents)}{' with this input' if rule.arg_match else ''}.")


# --- external tasks ----------------------------------------------------------------------------

def _external_page(request, *, bound=None, status=200):
    page = page_of(request, selectors.external_tasks(tenant=request.tenant))
    tasks = []
    for call in page:
        form = bound[1] if bound and bound[0] == call.pk else ExternalResultForm(auto_id=f"id_%s_{call.pk}")
        tasks.append((call, form))
    return render(request, "inbox/external.html", {
        "page": page, "tasks": tasks, "tab": "external", "may_decide": request.membership.can_review,
        "filters": {}, **_tabs(request),
    }, status=status)


@tenant_view()
def inbox_external(request):
    return _external_page(request)


@tenant_view(methods=("POST",), write=MEMBER)
def inbox_external_respond(request, call):
    _require_reviewer(request)
    form = ExternalResultForm(request.POST, auto_id=f"id_%s_{call.pk}")
    if form.is_valid():
        data = form.cleaned_data
        text = data["text"].strip()
        try:
            services.external_result_post(call=call, actor=acting_user(request), state=data["state"],
                                          content=[{"type": "text", "text": text}] if text else [],
                                          structured=data["structured"])
        except Conflict as exc:
            messages.error(request, f"{call.tool_name} ({call.call_id}): not recorded — {exc.message}.")
            return tenant_redirect(request, "inbox:inbox_external")
        except SERVICE_REFUSALS as exc:
            add_service_errors(form, exc)
        else:
            messages.success(request, f"{call.tool_name} ({call.call_id}): result recorded ({data['state']}).")
            return tenant_redirect(request, "inbox:inbox_external")
    return _external_page(request, bound=(call.pk, form), status=INVALID_STATUS)


# --- rules -------------------------------------------------------------------------------------

@tenant_view()
def rule_list(request):
    tenant = request.tenant
    rules = (PermissionRule.objects.for_tenant(tenant).select_related("queue")
             .order_by(BEHAVIOR_ORDER, "-priority", "id"))
    simulator = SimulatorForm(request.GET if "tool" in request.GET else None)
    decision = decision_rule = considered = in_force = None
    if simulator.is_bound and simulator.is_valid():
        data = simulator.cleaned_data
        session = grants.session_of(tenant=tenant, session_id=data["session"]) if data["session"] else None
        agent, user = data["agent"], data["user"]
        if session is not None:
            agent, user = agent or session.agent, user or session.user
        call = {"tool_name": data["tool"], "tool_input": data["input"], "agent": agent, "user": user}
        if data["session"] and (session is None or session.agent != agent):
            simulator.add_error("session", "no such session of this agent")
        else:
            decision = selectors.simulate(tenant=tenant, session=session, **call)
            considered = selectors.rules_considered(tenant=tenant, decision=decision, **call)
            in_force = grants.grants_in_force(tenant=tenant, agent=agent, tool_name=data["tool"], session=session)
        if decision is not None and decision.rule is not None:
            decision_rule = PermissionRule.objects.for_tenant(tenant).filter(pk=decision.rule).first()
    # A pattern that matches no tool is kept (its tool may come later), but said, with the names it may mean.
    names = selectors.tool_names(tenant=tenant)
    rule_rows = []
    for rule in rules:
        matched, suggestions = selectors.tools_matching(tenant=tenant, pattern=rule.tool_pattern, names=names)
        rule_rows.append((rule, None if matched else suggestions))
    return render(request, "inbox/rule_list.html", {
        "rule_rows": rule_rows, "simulator": simulator, "decision": decision, "decision_rule": decision_rule,
        "considered": considered, "grants_in_force": in_force,
        "tool_names": names,
    })


_RULE_FORM = {"form_class": RuleForm, "template_name": "inbox/rule_form.html", "success_url": "inbox:rule_list"}
class RuleSave(ObjectFormView):
    """Saves a rule, and warns when its tool pattern matches none of the tenant's tools."""

    def message(self, rule) -> str:
        matched, suggestions = selectors.tools_matching(tenant=self.request.tenant, pattern=rule.tool_pattern)
        if not matched:
            meant = " or ".join(suggestions)
            messages.warning(self.request, f"The tool pattern {rule.tool_pattern!r} matches none of the tools now"
                                           + (f": did you mean {meant}?" if meant else "."))
        return super().message(rule)


rule_create = RuleSave.as_view(
    service=services.rule_create,
    success_message="Rule #{object.pk} ({object.behavior} {object.tool_pattern}) created.", **_RULE_FORM)
rule_edit = RuleSave.as_view(service=services.rule_update, success_message="Rule #{object.pk} saved.", **_RULE_FORM)
rule_delete = ObjectDeleteView.as_view(
    service=services.rule_delete, template_name="inbox/rule_delete.html", success_url="inbox:rule_list",
    success_message="Rule #{object.pk} ({object.behavior} {object.tool_pattern}) deleted.")


# --- queues ------------------------------------------------------------------------------------

@tenant_view()
def queue_list(request):
    tenant = request.tenant
    queues = list(Queue.objects.for_tenant(tenant).prefetch_related("reviewers", "escalation_reviewers"))
    counts = selectors.pending_counts_by_queue(tenant=tenant)
    return render(request, "inbox/queue_list.html", {
        "queues": [(queue, counts.get(queue.name, 0)) for queue in queues],
        "unrouted": counts.get("", 0),
    })


class QueueEdit(ObjectFormView):
    """`queue_save` takes the tenant and the queue."""

    def save(self, values: dict) -> Queue:
        return services.queue_save(tenant=self.request.tenant, queue=self.object, actor=acting_user(self.request),
                                   **values)


_QUEUE_FORM = {"form_class": QueueForm, "template_name": "inbox/queue_form.html", "success_url": "inbox:queue_list"}
queue_create = ObjectFormView.as_view(service=services.queue_save, success_message="Queue {object.name} created.",
                                      **_QUEUE_FORM)
queue_edit = QueueEdit.as_view(success_message="Queue {object.name} saved.", **_QUEUE_FORM)
queue_delete = ObjectDeleteView.as_view(
    service=services.queue_delete, template_name="inbox/queue_delete.html", success_url="inbox:queue_list",
    success_message="Queue {object.name} deleted.")


# --- notifications -----------------------------------------------------------------------------

def _channel_of(queue, channel):
    if channel.queue_id != queue.pk:
        raise Http404("no such channel")
    return channel


def _channel_page(request, queue, form, *, channel=None, status=200):
    tenant = request.tenant
    deliveries = (Notification.objects.for_tenant(tenant).filter(channel__queue=queue)
                  .select_related("channel", "request"))
    return render(request, "inbox/queue_notifications.html", {
        "queue": queue, "channel": channel, "form": form,
        "channels": NotificationChannel.objects.for_tenant(tenant).filter(queue=queue),
        "page": page_of(request, deliveries), "statuses": DeliveryStatus,
    }, status=status)


def _save_channel(request, queue, channel=None):
    form = ChannelForm(request.POST)
    if form.is_valid():
        try:
            saved = notifications.channel_save(queue=queue, channel=channel, actor=acting_user(request),
                                               **form.cleaned_data)
        except SERVICE_REFUSALS as exc:
            add_service_errors(form, exc)
        else:
            messages.success(request, f"Channel {saved.name} saved.")
            return tenant_redirect(request, "inbox:queue_notifications", queue_id=queue.pk)
    secrets_not_kept(form)  # the URL and the secret are never rendered back: a Slack URL holds its token
    return _channel_page(request, queue, form, channel=channel, status=INVALID_STATUS)


@tenant_view(methods=("GET", "POST"), read=OPERATE)
def queue_notifications(request, queue):
    """A queue's channels, a form for a new one, and the delivery log."""
    if request.method == "POST":
        return _save_channel(request, queue)
    return _channel_page(request, queue, ChannelForm(initial={"events": [NotifyEvent.REQUESTED],
                                                              "enabled": True}))


@tenant_view(methods=("GET", "POST"), read=OPERATE)
def channel_edit(request, queue, channel):
    channel = _channel_of(queue, channel)
    if request.method == "POST":
        return _save_channel(request, queue, channel)
    initial = {name: getattr(channel, name) for name in
               ("name", "kind", "events", "quiet_from", "quiet_until", "action_links", "enabled")}
    return _channel_page(request, queue, ChannelForm(initial=initial), channel=channel)


@tenant_view(methods=("GET", "POST"), read=OPERATE)
def channel_delete(request, queue, channel):
    channel = _channel_of(queue, channel)
    if request.method == "GET":
        return render(request, "inbox/channel_delete.html", {"queue": queue, "channel": channel})
    notifications.channel_delete(channel=channel, actor=acting_user(request))
    messages.success(request, f"Channel {channel.name} deleted.")
    return tenant_redirect(request, "inbox:queue_notifications", queue_id=queue.pk)


@tenant_view(methods=("POST",))
def channel_test(request, queue, channel):
    channel = _channel_of(queue, channel)
    try:
        notifications.channel_test(channel=channel, actor=request.user)
    except SERVICE_REFUSALS as exc:
        for text in service_messages(exc):
            messages.error(request, text)
    else:
        messages.success(request, f"A test notification to {channel.name} is on its way: see the log below.")
    return tenant_redirect(request, "inbox:queue_notifications", queue_id=queue.pk)


@tenant_view(methods=("GET", "POST"), write=MEMBER)
def my_notifications(request):
    """A reviewer's own notification settings."""
    tenant = request.tenant
    setting = ReviewerNotifySetting.objects.for_tenant(tenant).filter(user=request.user).first()
    channels = (NotificationChannel.objects.for_tenant(tenant).filter(kind__in=reviewer_kind_names())
                .select_related("queue"))
    status = 200
    if request.method == "POST":
        form = ReviewerNotifyForm(request.POST, channels=channels)
        if form.is_valid():
            notifications.reviewer_setting_save(tenant=tenant, user=request.user, muted=form.cleaned_data["muted"],
                                                excluded=form.cleaned_data["excluded"])
            messages.success(request, "Your notification settings are saved.")
            return tenant_redirect(request, "inbox:my_notifications")
        status = INVALID_STATUS
    else:
        form = ReviewerNotifyForm(channels=channels, initial={
            "muted": setting.muted if setting else False,
            "excluded": list(setting.excluded.all()) if setting else []})
    return render(request, "inbox/my_notifications.html", {
        "form": form, "email": request.user.email, "tab": "notifications",
        "slack_identities": slack.identities_of(tenant=tenant, user=request.user), **_tabs(request)}, status=status)


@tenant_view(methods=("GET", "POST"), write=MEMBER)
def inbox_act(request):
    """A decision link from a message (`?token=`): GET shows what it would do (mail scanners fetch links), POST
    does it."""
    tenant = request.tenant
    token = request.GET.get("token", "")
    try:
        link = decision_links.link_open(tenant=tenant, token=token)
    except decision_links.LinkRefused as exc:  # a page that says why (a POST through it is gone for good)
        return render(request, "inbox/act.html", {"refused": str(exc)}, status=410 if request.method == "POST" else 200)
    status = 200
    refused = ""
    if request.method == "POST":
        try:
            settled = decision_links.link_use(tenant=tenant, token=token, user=request.user)
        except decision_links.LinkRefused as exc:
            return render(request, "inbox/act.html", {"refused": str(exc)}, status=410)
        except NotPermitted as exc:
            refused, status = exc.message, 403
        except Conflict as exc:
            refused, status = exc.message, 409
        except SERVICE_REFUSALS as exc:
            refused, status = exc.message, 400
        else:
            messages.success(request, _decided_message(settled, link.decision))
            return tenant_redirect(request, "inbox:inbox_request", request_id=settled.pk)
    return render(request, "inbox/act.html", {"link": link, "approval": link.request, "refused": refused},
                  status=status)


# --- grants ------------------------------------------------------------------------------------

@tenant_view()
def grant_list(request):
    """The tenant's grants (or one session's, `?session=`), in force first by default (`?active=`)."""
    tenant = request.tenant
    session = None
    if request.GET.get("session"):
        session = grants.session_of(tenant=tenant, session_id=request.GET["session"])
        if session is None:
            raise Http404("No such session.")
    active = {"": True, "true": True, "false": False, "all": None}.get(request.GET.get("active", ""), True)
    page = page_of(request, grants.grants_list(tenant=tenant, session=session, active=active))
    return render(request, "inbox/grant_list.html", {
        "page": page, "session": session, "active": active, "now_rows": [(g, grants.is_in_force(g)) for g in page],
        "may_revoke": request.membership.can_review,
    })


@tenant_view(methods=("GET", "POST"), write=MEMBER)
def grant_revoke(request, grant):
    """Ask before revoking a grant; the POST revokes it (reviewers, operators and admins)."""
    _require_reviewer(request)
    errors = []
    if request.method == "POST":
        try:
            services.grant_revoke(grant=grant, actor=acting_user(request))
        except Conflict as exc:
            errors.append(exc.message)
        else:
            messages.success(request, f"Grant #{grant.pk} is revoked: {grant.tool_name} asks again for "
                                      f"{grant.agent}.")
            return tenant_redirect(request, "inbox:grant_list")
    return render(request, "inbox/grant_revoke.html", {
        "grant": grant, "describe": grants.describe(grant), "in_force": grants.is_in_force(grant), "errors": errors,
    }, status=409 if errors else 200)


# --- decisions from Slack (approvals.slack) ----------------------------------------------------

@csrf_exempt
@require_POST
def slack_interaction(request, public_id):
    """Slack's interactivity request URL of one channel: outside any login, trusted only by its signature."""
    try:
        declared = int(request.META.get("CONTENT_LENGTH") or 0)
    except ValueError:
        declared = 0
    if declared > slack.MAX_BODY_BYTES:
        return HttpResponse("the request body is larger than the limit", status=413, content_type="text/plain")
    try:
        interaction = slack.interaction_handle(
            public_id=public_id, timestamp=request.headers.get("X-Slack-Request-Timestamp", ""),
            signature=request.headers.get("X-Slack-Signature", ""), body=request.body)
    except slack.SlackRefused as exc:
        return HttpResponse(exc.message, status=exc.status, content_type="text/plain; charset=utf-8")
    return _AnsweredThenReplied(interaction)


class _AnsweredThenReplied(HttpResponse):
    """Slack's 200, and the click's replies posted once it is sent (the server closes a response after sending it):
    Slack gives an interaction three seconds, whatever the replies' way takes."""

    def __init__(self, interaction):
        super().__init__(status=200)
        self.interaction = interaction

    def close(self):
        super().close()
        slack.replies_send(self.interaction)


@tenant_view(methods=("GET", "POST"), write=MEMBER)
def slack_link(request):
    """The link a Slack user was given (`?token=`): GET says what it links, POST links it to the logged-in member."""
    token = request.GET.get("token", "")
    try:
        link = slack.link_open(tenant=request.tenant, token=token)
        if request.method == "POST":
            slack.link_use(tenant=request.tenant, token=token, user=request.user)
            messages.success(request, "Your Slack user is linked: its clicks now decide as you.")
            return tenant_redirect(request, "inbox:my_notifications")
    except slack.LinkRefused as exc:
        return render(request, "inbox/slack_link.html", {"refused": str(exc)},
                      status=410 if request.method == "POST" else 200)
    return render(request, "inbox/slack_link.html", {"link": link})


@tenant_view(methods=("GET", "POST"), write=MEMBER)
def slack_unlink(request):
    """POST unlinks one of the member's own Slack users; GET goes to the page that lists them."""
    identity = request.POST.get("identity", "")
    chosen = int(identity) if identity.isascii() and identity.isdigit() and len(identity) <= 18 else None
    if request.method == "POST" and chosen is not None and slack.identity_unlink(
            tenant=request.tenant, user=request.user, identity_id=chosen):
        messages.success(request, "Your Slack user is unlinked.")
    return tenant_redirect(request, "inbox:my_notifications")

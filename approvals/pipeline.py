"""The permission step of the call chain, and the wait for an external result (both registered in
`tools.calls.pipeline.CALL_STEPS` by approvals.apps)."""
from approvals.grants import grant_use
from approvals.models import Queue
from approvals.notifications import notify_external_task
from approvals.selectors import evaluate
from approvals.services import request_open
from tools.calls.pipeline import CallContext, Step
from tools.calls.pipeline import External as ExternalStep
from tools.calls.questions import confirm_ask
from tools.models import CallStatus

META_DECISION = {"behavior": "allow", "rule": None, "reason": "meta tools change only the session's tool surface"}


class Permission(Step):
    name = "permission"

    def process(self, ctx: CallContext) -> bool:
        session = ctx.session
        if ctx.exposed is not None and ctx.exposed.is_meta:
            ctx.set(decision=META_DECISION)
            return True  # meta tools only reshape the session's own tool surface
        decision = evaluate(tenant=session.tenant, tool_name=ctx.call.tool_name,
                            effective_input=ctx.call.effective_input, agent=session.agent, user=session.user,
                            tool=ctx.exposed.tool if ctx.exposed else None, user_verified=session.user_verified,
                            session=session)
        ctx.set(decision=decision.as_dict())
        if decision.grant is not None:
            ctx.flush()  # a new call's row is written now, so that its timeline names the grant first
            grant_use(call=ctx.call, grant_id=decision.grant, reason=decision.reason)
        if decision.behavior == "deny":
            return ctx.fail("PermissionDenied", decision.reason, status=CallStatus.DENIED)
        if decision.behavior == "confirm":
            queue = (Queue.objects.for_tenant(session.tenant_id).filter(pk=decision.queue).first()
                     if decision.queue is not None else None)
            if not ctx.confirmed:  # the session's own user is asked first
                expires = queue.expires_after.total_seconds() if queue is not None and queue.expires_after else None
                return confirm_ask(ctx, reason=decision.reason, seconds=expires)
            if queue is None:
                return True  # the user's word is enough
        if decision.behavior in ("ask", "confirm"):  # a confirm naming a queue: its reviewers decide next
            if not ctx.transition(CallStatus.AWAITING_APPROVAL):
                return False
            request_open(call=ctx.call, session=session, decision=decision)
            return False
        return True


class External(ExternalStep):
    """The call chain's external step, telling the default queue's channels that an external task waits."""

    def process(self, ctx: CallContext) -> bool:
        proceed = super().process(ctx)
        if not proceed and ctx.call.status == CallStatus.AWAITING_EXTERNAL:
            notify_external_task(ctx.call)
        return proceed

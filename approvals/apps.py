from django.apps import AppConfig


class ApprovalsConfig(AppConfig):
    name = "approvals"

    def ready(self):
        from django.db.models.signals import post_save

        from approvals.channel_kinds import register_channel_kind
        from approvals.exposure import tools_always_denied
        from approvals.models import Vote
        from approvals.notifications import (
            BUILT_IN_KINDS,
            DELIVER_JOB,
            DIGEST_JOB,
            deliveries_send,
            expiry_digest,
            notify_definition_proposed,
        )
        from approvals.pipeline import External, Permission
        from approvals.selectors import approvals_for_calls, ever_asked, untrusted_outcomes
        from approvals.services import default_queue, request_cancel_for_call, requests_expire_due
        from approvals.timeline import vote_on_timeline
        from tenancy.signals import tenant_created
        from tools.calls.pipeline import CALL_STEPS
        from tools.calls.runtime import runtime
        from tools.catalog.registry import (
            register_background,
            register_call_annotator,
            register_exposure_filter,
            register_outcome_describer,
            register_periodic,
        )
        from tools.signals import call_cancelled, tool_definition_proposed

        for kind in BUILT_IN_KINDS:
            register_channel_kind(kind)
        CALL_STEPS.register(400, Permission)
        CALL_STEPS.register(500, External)
        register_call_annotator(approvals_for_calls, describes=ever_asked)
        register_periodic("approvals.expire", lambda: requests_expire_due(), every_s=5)
        register_exposure_filter(tools_always_denied)
        register_outcome_describer(untrusted_outcomes)
        register_background(DELIVER_JOB, lambda: deliveries_send())
        # the periodic pass only hands the sending to the background workers: a slow receiver must not hold the
        # embedded runner's one thread, which runs every other periodic job too
        register_periodic(DELIVER_JOB, lambda: runtime().run_soon(DELIVER_JOB), every_s=5)
        register_periodic(DIGEST_JOB, lambda: expiry_digest(), every_s=60)
        call_cancelled.connect(request_cancel_for_call, dispatch_uid="approvals.cancel_request")
        tool_definition_proposed.connect(notify_definition_proposed, dispatch_uid="approvals.definition_proposed")
        post_save.connect(vote_on_timeline, sender=Vote, dispatch_uid="approvals.vote_on_timeline")
        tenant_created.connect(lambda sender, tenant, **kw: default_queue(tenant), weak=False,
                               dispatch_uid="approvals.default_queue")

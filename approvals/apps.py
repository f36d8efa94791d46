from django.apps import AppConfig


class ApprovalsConfig(AppConfig):
    name = "approvals"

    def ready(self):
        from tenancy.signals import tenant_created
        from tools.registry import register_call_annotator, register_exposure_filter, register_periodic
        from tools.signals import call_cancelled

        from .exposure import tools_always_denied
        from .selectors import approvals_for_calls, ever_asked
        from .services import default_queue, request_cancel_for_call, requests_expire_due

        register_call_annotator(approvals_for_calls, describes=ever_asked)
        register_periodic("approvals.expire", lambda: requests_expire_due(), every_s=5)
        register_exposure_filter(tools_always_denied)
        call_cancelled.connect(request_cancel_for_call, dispatch_uid="approvals.cancel_request")
        tenant_created.connect(lambda sender, tenant, **kw: default_queue(tenant), weak=False,
                               dispatch_uid="approvals.default_queue")

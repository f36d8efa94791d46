from django.apps import AppConfig


class ApprovalsConfig(AppConfig):
    name = "approvals"

    def ready(self):
        from tenancy.signals import tenant_created
        from tools.registry import register_call_annotator, register_periodic

        from .selectors import approvals_for_calls
        from .services import default_queue, requests_expire_due

        register_call_annotator(approvals_for_calls)
        register_periodic("approvals.expire", lambda: requests_expire_due(), every_s=5)
        tenant_created.connect(lambda sender, tenant, **kw: default_queue(tenant), weak=False,
                               dispatch_uid="approvals.default_queue")

"""The platform's own errors: what a service raises when it refuses a request.

Services are called by the API, the console and management commands, so they speak none of those front
doors' errors; each front door maps these in one place: the API in `common.api.exception_handler`
(status and the JSON error envelope), the console in `tenancy.web` (errors on the form, the page's
status), commands into a `CommandError`. Nothing here imports Django or DRF: every layer may raise them.

`detail` says why, in one of three shapes: a message, a list of messages, or `{field: [messages]}`.
"""


class ServiceError(Exception):
    """A refused request: the input is invalid, or the request makes no sense as it stands (400)."""

    status = 400
    code = "invalid"

    def __init__(self, detail):
        super().__init__(detail)
        self.detail = detail

    @property
    def fields(self) -> dict:
        """The messages by field, each a list; {} when the refusal concerns the whole request."""
        if not isinstance(self.detail, dict):
            return {}
        return {field: _messages(value) for field, value in self.detail.items()}

    @property
    def messages(self) -> list[str]:
        """The messages that concern the whole request; [] when the refusal is by field."""
        return [] if isinstance(self.detail, dict) else _messages(self.detail)

    @property
    def message(self) -> str:
        """The refusal in one line."""
        return "; ".join([*self.messages, *(f"{field}: {' '.join(texts)}" for field, texts in self.fields.items())])


class NotPermitted(ServiceError):
    """The actor may not do this (403), e.g. a reviewer deciding outside their queues."""

    status = 403
    code = "permission_denied"


class Conflict(ServiceError):
    """The object is not in a state that allows this (409), e.g. cancelling a call that has settled."""

    status = 409
    code = "conflict"


class RateLimited(ServiceError):
    """Too many requests or calls for now (429); `retry_after` says in how many seconds to try again."""

    status = 429
    code = "rate_limited"

    def __init__(self, detail, *, retry_after: int):
        super().__init__(detail)
        self.retry_after = retry_after


def _messages(value) -> list[str]:
    return [str(item) for item in value] if isinstance(value, list | tuple) else [str(value)]

"""The inbound_email app's own errors."""

from __future__ import annotations


class InboundEmailError(Exception):
    """Base of the app's errors."""


class InvalidRating(InboundEmailError):
    """A rating that is not an integer 1-5; the message is the reason shown to operators."""


class StoreError(InboundEmailError):
    """A mail store operation failed. `transient` errors (throttling, network) are retried."""

    def __init__(self, message: str, *, transient: bool) -> None:
        super().__init__(message)
        self.transient = transient


class StoreNotFound(StoreError):
    """The object is not in the store (already deleted by someone else)."""

    def __init__(self, message: str) -> None:
        super().__init__(message, transient=False)


class InvalidStoreUrl(InboundEmailError):
    """INBOUND_EMAIL_STORE is neither s3://bucket/prefix nor a folder path."""


class MailNotInState(InboundEmailError):
    """An action was asked of a ledger row in the wrong status (e.g. reprocess a processed mail)."""


class SlackPostError(InboundEmailError):
    """A chat.postMessage failed; `retry_after` (seconds) is set when Slack asked us to wait."""

    def __init__(self, message: str, *, retry_after: float | None = None) -> None:
        super().__init__(message)
        self.retry_after = retry_after


class SlackLookupError(InboundEmailError):
    """A channel's history could not be searched to the end (API error, 429, network); the
    caller cannot tell whether an earlier post arrived. `retry_after` as in SlackPostError."""

    def __init__(self, message: str, *, retry_after: float | None = None) -> None:
        super().__init__(message)
        self.retry_after = retry_after


class MailLimitExceeded(InboundEmailError):
    """A mail passed one of the parsing limits (hostile or absurd): quarantined at once.

    `limit` names the setting (e.g. INBOUND_EMAIL_MAX_MIME_PARTS), `reason` is the
    InboundEmail.Reason the mail is quarantined with; the message says what was found.
    """

    def __init__(self, *, limit: str, reason: str, detail: str) -> None:
        super().__init__(f"{limit}: {detail}")
        self.limit = limit
        self.reason = reason
        self.detail = detail


class CallDeadlinePassed(InboundEmailError):
    """Too little of a relay attempt's claim is left to start a Slack call: it is not sent
    (a request sent after the claim expired could land after another worker's look-up)."""

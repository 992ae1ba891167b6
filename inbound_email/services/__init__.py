"""State changes of inbound mail, one module per job:

* `intake`: register listed objects, claim one (lease + attempt count), read and map it, carry
  out the acceptance decision, count failures (retry or quarantine).
* `acceptance`: the pure policy, a parsed mail plus a notification snapshot → Accept | Reject.
* `ledger`: the outcome writes shared by intake and relay (finish, reject, quarantine, a reply
  that now counts).
* `relay`: the instruction outbox (Slack, else the database inbox).
* `store_sync`: after commit, the store follows the ledger (delete, quarantine copy).
* `actions`: operator actions (raw source, reprocess, discard, acknowledge).

Import from the module that owns a name. The two re-exports below keep the public names the
tests and the operator-facing docs have always used.
"""

from inbound_email.services.actions import reply_acknowledge
from inbound_email.services.relay import reply_relay

__all__ = ["reply_acknowledge", "reply_relay"]

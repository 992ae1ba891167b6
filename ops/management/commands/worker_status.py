import json

from django.core.management.base import BaseCommand, CommandError

from ops.durations import humanize_seconds
from ops.status import describe_session, worker_status


class Command(BaseCommand):
    help = (
        "Queue depth, stuck jobs, quarantined mail, notifications and writer-slot leases. "
        "Exits 1 when something needs an operator."
    )

    def add_arguments(self, parser) -> None:
        parser.add_argument("--json", action="store_true", help="machine-readable output")

    def handle(self, *args, **options) -> None:
        status = worker_status()
        if options["json"]:
            self.stdout.write(json.dumps(status.as_dict(), indent=2, sort_keys=True))
        else:
            self._print(status)
        if status.needs_operator:
            raise CommandError(
                f"{len(status.needs_operator)} finding(s) need an operator", returncode=1
            )

    def _print(self, status) -> None:
        out = self.stdout.write
        db = status.database
        kind = "embedded PostgreSQL" if db["embedded"] else "PostgreSQL"
        out(f"Database:      {kind} {db['server_version']} at {db['where']}")
        oldest = status.oldest_transaction
        if oldest:
            out(
                f"  oldest transaction: {describe_session(oldest)}, open "
                f"{humanize_seconds(oldest['age_seconds'])}"
            )
        out("Jobs:          " + _fmt(status.jobs_by_status))
        for kind, counts in status.jobs_by_kind.items():
            out(f"  {kind}: {_fmt(counts)}")
        for paused in status.paused_kinds:
            out(f"  PAUSED: {paused['kind']} since {paused['paused_at'][:19]} (not claimed)")
        if status.oldest_due_job:
            job = status.oldest_due_job
            out(
                f"  oldest due: #{job['id']} {job['kind']} "
                f"waiting {humanize_seconds(job['waiting_seconds'])}"
            )
        for job in status.stuck_jobs:
            out(
                f"  STUCK: #{job['id']} {job['kind']} locked by {job['locked_by']} "
                f"lease expired {job['lease_expired_at']}"
            )
        out("Inbound mail:  " + _fmt(status.inbound_by_status))
        out(f"  quarantined: {status.quarantined_mail}")
        out(f"  instructions waiting for an operator: {status.instructions_needing_operator}")
        out(f"  instruction relays stuck over 24 h: {status.instruction_relays_stuck}")
        out("Notifications: " + _fmt(status.notifications_by_status))
        out(f"  stuck in sending: {status.notifications_stuck_sending}")
        feedback = status.mail_feedback
        if feedback:
            out(
                f"  last 24 h: {feedback['sent']} sent, "
                f"bounce rate {feedback['bounce_percent']} %, "
                f"complaint rate {feedback['complaint_percent']} %, "
                f"{feedback['suppressed_addresses']} suppressed address(es)"
            )
        if status.sending.get("paused_until"):
            out(
                f"  SENDING PAUSED until {status.sending['paused_until']}: "
                f"{status.sending['reason']}"
            )
        out(f"Writer slots:  {len(status.leases)} held")
        for lease in status.leases:
            out(
                f"  slot {lease['slot']:>2} {lease['role']:<10} {lease['holder']} "
                f"until {lease['expires_at']}"
            )
        live = sum(1 for p in status.processes if p["state"] == "live")
        out(f"Processes:     {live} live, {len(status.processes) - live} gone in the last hour")
        for p in status.processes:
            doing = f" running {p['current']}" if p["current"] else ""
            out(
                f"  {p['state'].upper():<7} {p['role']:<18} {p['host']}:{p['pid']} "
                f"v{p['version']} since {p['started_at'][:19]}, last beat "
                f"{p['heartbeat_at'][:19]}{doing}"
            )
        overdue = sum(1 for s in status.schedules if s["overdue"])
        out(f"Schedules:     {len(status.schedules)}, {overdue} overdue")
        for s in status.schedules:
            flag = "OVERDUE" if s["overdue"] else "ok"
            last = (s["last_run_at"] or "never")[:19]
            nxt = (s["next_run"] or "-")[:19]
            out(f"  {flag:<7} {s['name']:<40} last {last} ({s['last_result']}), next {nxt}")
        if status.needs_operator:
            out("")
            out("NEEDS AN OPERATOR:")
            for finding in status.needs_operator:
                out(f"  - {finding}")
        else:
            out("")
            out("OK: nothing needs an operator.")


def _fmt(counts: dict[str, int]) -> str:
    return ", ".join(f"{key}={value}" for key, value in counts.items()) or "none"

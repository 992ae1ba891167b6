"""The operator's summary in a terminal: worker_status's report as text (or --json), exit
status 1 when something needs an operator.

Every time is printed one way, in UTC and saying so (`2026-12-06 23:05:41 UTC`, as the
admin's pages write it); the JSON keeps ISO 8601 with its offset. Run from the command line,
a report that needs an operator ends with one plain line on stderr and exit status 1, not
Django's `CommandError: …` (issue 36.8); called in-process (call_command) it still raises
CommandError with returncode 1.
"""

import json
import sys
from datetime import UTC, datetime

from django.core.management.base import BaseCommand, CommandError

from ops.durations import humanize_seconds
from ops.status import describe_session, slots_by_kind, slots_line, worker_status


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
            count = len(status.needs_operator)
            where = "in the report's needs_operator" if options["json"] else "listed above"
            line = (
                f"{count} finding{'s' * (count != 1)} need{'s' * (count == 1)} an operator "
                f"({where})"
            )
            if not self._called_from_command_line:
                raise CommandError(line, returncode=1)
            self.stdout.flush()
            self.stderr.write(f"worker_status: {line}")
            sys.exit(1)

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
            out(f"  PAUSED: {paused['kind']} since {_at(paused['paused_at'])} (not claimed)")
        for cap in status.kind_caps:
            out(
                f"  CAP: {cap['kind']} at most {cap['concurrency']} at once "
                f"({cap['running']} running)"
            )
        for rate in status.kind_rates:
            wait = rate["next_token_in_seconds"]
            token = f"next token in {humanize_seconds(wait)}" if wait > 0 else "a token is there"
            out(f"  RATE: {rate['kind']} at most {rate['rate']} ({token})")
        for kind, stopped in status.jobs_stopped_last_hour.items():
            out(
                f"  STOPPED (last hour): {kind} {stopped['timeout']} timed out, "
                f"{stopped['cancel']} cancelled"
            )
        if status.oldest_due_job:
            job = status.oldest_due_job
            out(
                f"  oldest due: #{job['id']} {job['kind']} "
                f"waiting {humanize_seconds(job['waiting_seconds'])}"
            )
        for job in status.stuck_jobs:
            out(
                f"  STUCK: #{job['id']} {job['kind']} locked by {job['locked_by']} "
                f"lease expired {_at(job['lease_expired_at'])}"
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
                f"  SENDING PAUSED until {_at(status.sending['paused_until'])}: "
                f"{status.sending['reason']}"
            )
        out(f"Writer slots:  {len(status.leases)} held")
        for lease in status.leases:
            out(
                f"  slot {lease['slot']:>2} {lease['role']:<10} {lease['holder']} "
                f"until {_at(lease['expires_at'])}"
            )
        live = sum(1 for p in status.processes if p["state"] == "live")
        out(f"Processes:     {live} live, {len(status.processes) - live} gone in the last hour")
        for p in status.processes:
            doing = f" running {p['current']}" if p["current"] else ""
            out(
                f"  {p['state'].upper():<7} {p['role']:<18} {p['host']}:{p['pid']} "
                f"v{p['version']} since {_at(p['started_at'])}, last beat "
                f"{_at(p['heartbeat_at'])}{doing}"
            )
            if p.get("slots"):
                out(f"          slots: {slots_line(p['slots'])}")
        in_use = slots_by_kind(status.processes)
        if in_use:
            listed = ", ".join(f"{kind} {n}" for kind, n in in_use.items())
            out(f"Slots in use:  {sum(in_use.values())} ({listed})")
        overdue = sum(1 for s in status.schedules if s["overdue"])
        out(f"Schedules:     {len(status.schedules)}, {overdue} overdue")
        for s in status.schedules:
            flag = "OVERDUE" if s["overdue"] else "ok"
            last = _at(s["last_run_at"]) if s["last_run_at"] else "never"
            nxt = _at(s["next_run"]) if s["next_run"] else "-"
            out(f"  {flag:<7} {s['name']:<40} last {last} ({s['last_result']}), next {nxt}")
        overdue = sum(1 for s in status.periodic if s["overdue"])
        out(f"Periodic jobs: {len(status.periodic)}, {overdue} overdue")
        for s in status.periodic:
            flag = "OVERDUE" if s["overdue"] else "ok"
            last = _at(s["last_tick_at"]) if s["last_tick_at"] else "never"
            nxt = _at(s["next_tick_at"]) if s["next_tick_at"] else "-"
            out(f"  {flag:<7} {s['name']:<40} last {last} ({s['last_outcome']}), next {nxt}")
        if status.needs_operator:
            out("")
            out("NEEDS AN OPERATOR:")
            for finding in status.needs_operator:
                out(f"  - {finding}")
        else:
            out("")
            out("OK: nothing needs an operator.")


def _at(iso: str) -> str:
    """An ISO 8601 time of the report (with its offset) as every line prints it: UTC, to
    the second, saying so."""
    return datetime.fromisoformat(iso).astimezone(UTC).strftime("%Y-%m-%d %H:%M:%S UTC")


def _fmt(counts: dict[str, int]) -> str:
    return ", ".join(f"{key}={value}" for key, value in counts.items()) or "none"

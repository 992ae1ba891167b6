"""The chaos scenario shared by tests/system/test_chaos.py (short, in CI) and bench/soak.py.

Two real qclusters on PostgreSQL, S3/SES in moto's server mode, the local Slack server. For
`seconds`, the scenario feeds work and injects faults at random (seeded):

- work: jobs enqueued from Django and inserted with plain SQL, new proposals (so the
  new-proposal sweep mails their PIs), replies to those mails dropped into the S3 intake
  (ratings, instructions, auto-replies, spoofed senders), and wake-ups of the drain, the
  reaper, the poller and the sweep;
- faults: SIGKILL of a worker process that holds a job, `pg_terminate_backend` of one
  cluster's database sessions, and a Slack that answers 429, 500 or slowly.

Then the faults stop and, once the system is quiet, the invariants are checked against the
database, S3, SES (moto runs in this process) and the Slack server's record. This module
runs in a process with Django set up on the database the clusters use (pytest's test
database, or the soak's own).
"""

from __future__ import annotations

import os
import random
import re
import signal
import time
from collections import Counter, defaultdict
from collections.abc import Callable
from dataclasses import dataclass, field
from itertools import pairwise
from pathlib import Path

import psycopg
from django.contrib.auth import get_user_model
from django.db import connection, transaction
from django_q.tasks import async_task

from canonical_ids.minter import parse_ts
from canonical_ids.models import Message
from inbound_email.models import InboundEmail, Reply
from inbound_email.services.relay import RELAY_EVENT_TYPE
from jobs import enqueue
from jobs.models import Job
from notifications.models import EmailNotification, NotificationPreference, Proposal
from ops.sample_mail import reply_mail
from tests.support.cluster import AwsServer, cluster_env, descendants, spawn_cluster, stop_cluster
from tests.support.processes import test_database_url
from tests.support.slack_server import SlackServer
from tests.system.handlers import SYSTEM_RUN_ID

JOB_KIND = "system.record"
APP_NAME = "chaos-cluster-{}"  # PGAPPNAME of each cluster: how its sessions are found
INSTRUCTION = "chaos-instruction-{}"  # marker of the instruction replying to notification N
_REAPED = re.compile(r"job reaped: #(\d+) .*\(was [^:()]*:(\d+):")
_LEASE_LOST = "was reaped while running"
# A slow Slack answers after the client's timeout: the post (or history read) went through,
# the worker cannot know it, and the relay must look it up rather than post again.
SLACK_SLOW = (10.5, 12.0)

# The clusters' settings: short leases and backoffs so a run settles within minutes.
CLUSTER_SETTINGS = {
    "JOBS_LEASE_SECONDS": "6",
    "JOBS_HEARTBEAT_SECONDS": "0.5",
    "JOBS_BACKOFF_BASE_SECONDS": "0.5",
    "JOBS_BACKOFF_CAP_SECONDS": "4",
    "JOBS_DRAIN_SECONDS": "20",
    "INBOUND_EMAIL_RETRY_BASE_SECONDS": "0.5",
    "INBOUND_EMAIL_RETRY_CAP_SECONDS": "4",
    "INBOUND_RELAY_BACKOFF_BASE_SECONDS": "0.5",
    "INBOUND_RELAY_BACKOFF_CAP_SECONDS": "4",
    "NOTIFICATION_RETRY_BASE_SECONDS": "1",
    "NOTIFICATION_RETRY_MAX_SECONDS": "5",
    "NOTIFICATION_CLAIM_TIMEOUT_SECONDS": "60",  # the setting's minimum
    "CANONICAL_IDS_LEASE_TTL": "6",
    "CANONICAL_IDS_RENEW_INTERVAL": "2",
    # The relay's claim of a worker killed between its post and its record is taken over
    # (and the post looked up) after this long: the setting's minimum.
    "INBOUND_RELAY_CLAIM_TIMEOUT_SECONDS": "60",
    "SLACK_TIMEOUT": "10",  # the setting's minimum; slow answers come after it (SLACK_SLOW)
    "LOG_LEVEL": "INFO",
}


@dataclass
class ChaosSettings:
    seconds: float  # how long faults are injected
    quiet_timeout: float = 240.0  # longest wait for the system to settle afterwards
    seed: int = 0
    clusters: int = 2
    fault_interval: float = 2.5  # mean seconds between process / connection faults
    slack_faults: tuple[float, float, float] = (0.2, 0.2, 0.2)  # 429, 500, slow


@dataclass
class Check:
    name: str
    ok: bool
    figure: str
    required: bool = True  # False: reported as a figure, not an invariant


@dataclass
class ChaosReport:
    seconds: float
    quiet_seconds: float
    settled: bool
    faults: dict[str, int]
    fed: dict[str, int]
    checks: list[Check] = field(default_factory=list)

    @property
    def failed(self) -> list[Check]:
        return [check for check in self.checks if check.required and not check.ok]

    def check(self, name: str) -> Check:
        return next(c for c in self.checks if c.name == name)

    def table(self) -> str:
        rows = [("faults injected", "count", "")]
        rows += [(f"  {name}", str(value), "") for name, value in self.faults.items()]
        rows += [("work fed", "count", "")]
        rows += [(f"  {name}", str(value), "") for name, value in self.fed.items()]
        rows += [("invariant (checked once quiet)", "result", "figures")]
        for check in self.checks:
            result = ("ok" if check.ok else "FAILED") if check.required else "figure"
            rows.append((f"  {check.name}", result, check.figure))
        width = max(len(r[0]) for r in rows)
        head = f"chaos: {self.seconds:.0f} s of faults, quiet after {self.quiet_seconds:.0f} s" + (
            "" if self.settled else " (did NOT settle within the timeout)"
        )
        lines = [head, ""]
        for name, result, figure in rows:
            lines.append(f"{name:<{width}}  {result:<7} {figure}".rstrip())
        return "\n".join(lines)


class ChaosRun:
    def __init__(self, config: ChaosSettings, workdir: Path, log: Callable[[str], None] = print):
        self.config = config
        self.workdir = workdir
        self.log = log
        self.rng = random.Random(config.seed)
        self.faults: Counter[str] = Counter()
        self.fed: Counter[str] = Counter()
        self.killed: set[int] = set()
        self.replied: set[int] = set()
        self.next_job = 0
        self.next_pi = 0

    # --- the run ---------------------------------------------------------------------------
    def run(self) -> ChaosReport:
        with AwsServer() as aws, SlackServer() as slack:
            self.aws, self.slack = aws, slack
            env = cluster_env(aws, slack.base_url, **CLUSTER_SETTINGS)
            self.clusters = [
                spawn_cluster(
                    {**env, "PGAPPNAME": APP_NAME.format(i)}, self.workdir / f"cluster{i}.log"
                )
                for i in range(self.config.clusters)
            ]
            try:
                self._chaos()
                quiet_started = time.monotonic()
                settled = self._settle()
                quiet = time.monotonic() - quiet_started
                report = ChaosReport(
                    seconds=self.config.seconds,
                    quiet_seconds=quiet,
                    settled=settled,
                    faults=self._fault_counts(),
                    fed=dict(self.fed),
                )
                report.checks = self._checks()
            finally:
                for cluster in self.clusters:
                    stop_cluster(cluster)
        return report

    def _chaos(self) -> None:
        self.slack.misbehave(
            rate_limited=self.config.slack_faults[0],
            server_error=self.config.slack_faults[1],
            slow=self.config.slack_faults[2],
            slow_seconds=SLACK_SLOW,  # past SLACK_TIMEOUT: posts land, then time out
            seed=self.config.seed,
        )
        end = time.monotonic() + self.config.seconds
        timers: dict[str, float] = defaultdict(float)
        schedule: list[tuple[str, float, Callable[[], None]]] = [
            ("enqueue", 0.5, self._enqueue_jobs),
            ("insert", 1.0, self._insert_job),
            ("proposal", 2.0, self._new_proposal),
            ("mail", 1.0, self._drop_mail),
            ("poke", 1.0, self._poke),
        ]
        next_fault = time.monotonic() + self.rng.expovariate(1 / self.config.fault_interval)
        while (now := time.monotonic()) < end:
            for name, every, action in schedule:
                if now >= timers[name]:
                    timers[name] = now + every
                    action()
            if now >= next_fault:
                next_fault = now + self.rng.expovariate(1 / self.config.fault_interval)
                (self._sigkill_worker if self.rng.random() < 0.4 else self._terminate_sessions)()
            time.sleep(0.05)
        self.slack.behave()

    def _settle(self) -> bool:
        deadline = time.monotonic() + self.config.quiet_timeout
        while time.monotonic() < deadline:
            self._drop_mail()  # replies to the last notices
            self._poke()
            if self._quiet():
                return True
            time.sleep(1.0)
        return False

    def _quiet(self) -> bool:
        pending_notices = Proposal.objects.exclude(
            pk__in=EmailNotification.objects.filter(
                kind=EmailNotification.Kind.NEW_PROPOSAL
            ).values("proposal_id")
        )
        return (
            not Job.objects.filter(status__in=[Job.Status.QUEUED, Job.Status.PROCESSING]).exists()
            and not InboundEmail.objects.exclude(status__in=InboundEmail.TERMINAL_STATUSES).exists()
            and self.aws.intake_count() == 0
            and InboundEmail.objects.count() == self.fed["mails"]
            and not EmailNotification.objects.filter(
                status__in=[EmailNotification.Status.PENDING, EmailNotification.Status.SENDING]
            ).exists()
            and not pending_notices.exists()
            and not Reply.objects.filter(
                relay_status__in=[Reply.RelayStatus.PENDING, Reply.RelayStatus.POSTING]
            ).exists()
            and self._unreplied() == []
        )

    # --- work ------------------------------------------------------------------------------
    def _job_payload(self, via: str) -> dict:
        self.next_job += 1
        return {"n": self.next_job, "via": via, "sleep": round(self.rng.uniform(0.02, 0.3), 3)}

    def _enqueue_jobs(self) -> None:
        with transaction.atomic():  # woken on commit, as the web app would
            for _ in range(self.rng.randint(1, 3)):
                enqueue(JOB_KIND, self._job_payload("django"))
                self.fed["jobs enqueued from Django"] += 1

    def _insert_job(self) -> None:
        """A job as another program writes it: a plain INSERT, no wake-up (the schedule or
        the next drain finds it)."""
        with psycopg.connect(test_database_url(), autocommit=True) as conn:
            conn.execute(
                "INSERT INTO jobs_job (kind, payload, status, priority, attempts, max_attempts, "
                "run_after, created_at, locked_by, last_error) "
                "VALUES (%s, %s, 'queued', 0, 0, 5, now(), now(), '', '')",
                [JOB_KIND, psycopg.types.json.Jsonb(self._job_payload("sql"))],
            )
        self.fed["jobs inserted with SQL"] += 1

    def _new_proposal(self) -> None:
        self.next_pi += 1
        n = self.next_pi
        pi = get_user_model().objects.create_user(
            username=f"chaos-pi{n}", email=f"chaos-pi{n}@example.org", password=None
        )
        NotificationPreference.objects.create(user=pi)
        Proposal.objects.create(
            title=f"Chaos proposal {n}",
            pi=pi,
            status=Proposal.Status.IN_REVIEW,
            run_id=f"chaos-run-{n}",
            slack_channel=f"C{n:08d}",
        )
        self.fed["proposals (each owes a notice)"] += 1

    def _unreplied(self) -> list[EmailNotification]:
        return list(
            EmailNotification.objects.filter(
                kind=EmailNotification.Kind.NEW_PROPOSAL,
                status=EmailNotification.Status.SENT,
            ).exclude(pk__in=self.replied)
        )

    def _drop_mail(self) -> None:
        """Reply to every notice sent since the last call: mostly an instruction with a
        rating; now and then an auto-reply or a spoofed sender (rejected) as well."""
        for notice in self._unreplied():
            self.replied.add(notice.pk)
            body = f"Rating: {self.rng.randint(1, 5)}\n\n{INSTRUCTION.format(notice.pk)} please."
            self._put(f"reply-{notice.pk}", reply_mail(notice, body, message_id=f"r{notice.pk}"))
            roll = self.rng.random()
            if roll < 0.15:
                self._put(
                    f"auto-{notice.pk}",
                    reply_mail(
                        notice,
                        "I am out of office.",
                        message_id=f"a{notice.pk}",
                        **{"Auto-Submitted": "auto-replied"},
                    ),
                )
            elif roll < 0.3:
                self._put(
                    f"spoof-{notice.pk}",
                    reply_mail(
                        notice, "Rating: 1", message_id=f"s{notice.pk}", From="x@evil.example"
                    ),
                )

    def _put(self, name: str, raw: bytes) -> None:
        self.aws.put_mail(name, raw)
        self.fed["mails"] += 1

    def _poke(self) -> None:
        """Wake-ups through django-q2's broker, as the (minute-grained) schedules do."""
        for func in (
            "jobs.tasks.run_due_jobs",
            "jobs.tasks.reap_stale_jobs",
            "inbound_email.tasks.poll_inbound_email",
            "notifications.tasks.new_proposal_sweep",
            "notifications.tasks.proposal_review_sweep",
        ):
            async_task(func)

    # --- faults ----------------------------------------------------------------------------
    def _cluster_pids(self) -> set[int]:
        pids: set[int] = set()
        for cluster in self.clusters:
            pids |= descendants(cluster.pid) - {cluster.pid}
        return pids

    def _sigkill_worker(self) -> None:
        """SIGKILL a worker process that holds a job right now (django-q2 starts another)."""
        owners = Job.objects.filter(status=Job.Status.PROCESSING).values_list(
            "locked_by", flat=True
        )
        holders = {int(owner.split(":")[-2]) for owner in owners if owner.count(":") >= 2}
        candidates = sorted(holders & self._cluster_pids())
        if not candidates:
            self.faults["SIGKILL skipped (no worker held a job)"] += 1
            return
        pid = self.rng.choice(candidates)
        try:
            os.kill(pid, signal.SIGKILL)
        except ProcessLookupError:
            return
        self.killed.add(pid)
        self.faults["SIGKILL of a worker holding a job"] += 1

    def _terminate_sessions(self) -> None:
        """`pg_terminate_backend` of every database session of one cluster."""
        name = APP_NAME.format(self.rng.randrange(len(self.clusters)))
        with connection.cursor() as cursor:
            cursor.execute(
                "SELECT count(*) FILTER (WHERE pg_terminate_backend(pid)) FROM pg_stat_activity "
                "WHERE datname = current_database() AND application_name = %s",
                [name],
            )
            ended = cursor.fetchone()[0]
        self.faults["pg_terminate_backend rounds"] += 1
        self.faults["  sessions terminated"] += ended

    def _fault_counts(self) -> dict[str, int]:
        statuses = Counter(call.status for call in self.slack.attempts())
        counts = dict(self.faults)
        counts["Slack 429 (Retry-After 1)"] = statuses[429]
        counts["Slack HTTP 500"] = statuses[500]
        low, high = SLACK_SLOW
        timeout = CLUSTER_SETTINGS["SLACK_TIMEOUT"]
        counts[f"Slack slow answers ({low}-{high} s, timeout {timeout} s)"] = (
            self.slack.slow_answers
        )
        return counts

    # --- the invariants --------------------------------------------------------------------
    def _checks(self) -> list[Check]:
        return [
            self._check_jobs(),
            self._check_no_live_job_reaped(),
            self._check_mail(),
            *self._check_notifications(),
            *self._check_instructions(),
            self._check_writer_slots(),
        ]

    def _check_jobs(self) -> Check:
        jobs = list(
            Job.objects.filter(kind=JOB_KIND).values_list("payload", "status", "last_error")
        )
        effects = Counter(
            Message.objects.filter(run_id=SYSTEM_RUN_ID).values_list("text", flat=True)
        )
        fed = self.fed["jobs enqueued from Django"] + self.fed["jobs inserted with SQL"]
        completed = failed = bad = 0
        for payload, status, last_error in jobs:
            runs = effects.get(f"job-{payload['n']}", 0)
            if status == Job.Status.COMPLETED and runs == 1:
                completed += 1
            elif status == Job.Status.FAILED and last_error and runs == 0:
                failed += 1
            else:
                bad += 1
        others = Job.objects.exclude(kind=JOB_KIND)
        stuck = others.filter(status__in=[Job.Status.QUEUED, Job.Status.PROCESSING]).count()
        unexplained = others.filter(status=Job.Status.FAILED, last_error="").count()
        retried = Job.objects.filter(kind=JOB_KIND, attempts__gt=1).count()
        ok = len(jobs) == fed and bad == 0 and stuck == 0 and unexplained == 0
        return Check(
            "every job completed once (or failed with a reason)",
            ok,
            f"{len(jobs)}/{fed} jobs: {completed} completed with one effect, {failed} failed "
            f"with a reason, {bad} wrong; {retried} needed retries; other kinds: {stuck} "
            f"stuck, {unexplained} failed without a reason",
        )

    def _log_text(self) -> str:
        return "\n".join(
            (self.workdir / f"cluster{i}.log").read_text(errors="replace")
            for i in range(len(self.clusters))
        )

    def _check_no_live_job_reaped(self) -> Check:
        logs = self._log_text()
        reaped = [(int(job), int(pid)) for job, pid in _REAPED.findall(logs)]
        live = [(job, pid) for job, pid in reaped if pid not in self.killed]
        lost = logs.count(_LEASE_LOST)
        return Check(
            "no live job was reaped",
            not live and lost == 0,
            f"{len(reaped)} reaped, all of SIGKILLed workers"
            if not live
            else f"{len(live)} of {len(reaped)} reaped from live workers: {live[:5]}"
            + f"; {lost} completions found their row reaped",
        )

    def _check_mail(self) -> Check:
        rows = Counter(InboundEmail.objects.values_list("status", flat=True))
        final = sum(n for status, n in rows.items() if status in InboundEmail.TERMINAL_STATUSES)
        intake = self.aws.intake_count()
        ok = final == self.fed["mails"] == sum(rows.values()) and intake == 0
        statuses = ", ".join(f"{n} {status}" for status, n in sorted(rows.items()))
        return Check(
            "every mail final and out of the intake",
            ok,
            f"{final}/{self.fed['mails']} final ({statuses}); {intake} left in the intake",
        )

    def _check_notifications(self) -> list[Check]:
        notices = EmailNotification.objects.filter(kind=EmailNotification.Kind.NEW_PROPOSAL)
        proposals = Proposal.objects.count()
        by_status = Counter(EmailNotification.objects.values_list("status", flat=True))
        unfinished = sum(
            by_status[status]
            for status in (
                EmailNotification.Status.PENDING,
                EmailNotification.Status.SENDING,
                EmailNotification.Status.FAILED,
            )
        )
        recorded = list(
            EmailNotification.objects.exclude(ses_message_id="").values_list(
                "ses_message_id", flat=True
            )
        )
        accepted = AwsServer.accepted_message_ids()
        phantom = set(recorded) - set(accepted)
        missing = proposals - notices.count()
        statuses = ", ".join(f"{n} {status}" for status, n in sorted(by_status.items()))
        return [
            Check(
                "no notification phantom-sent or lost",
                not phantom and unfinished == 0 and missing == 0,
                f"{sum(by_status.values())} notifications ({statuses}), a notice for "
                f"{proposals - missing}/{proposals} proposals; {len(phantom)} sent rows SES "
                f"never accepted, {unfinished} pending/sending/failed",
            ),
            Check(
                "duplicate notification mails (I12 allows one per crash)",
                True,
                f"{len(accepted) - len(recorded)} of {len(accepted)} mails accepted by SES",
                required=False,
            ),
        ]

    def _check_instructions(self) -> list[Check]:
        """Every instruction posted exactly once or inboxed, never both, never lost.

        Counted from what the Slack server's channels kept (by the reply id in each
        message's metadata), whatever the poster was answered: a post Slack stored but
        answered after the timeout, with a 500, or to a worker SIGKILLed before its record
        is in the channel, and the relay must have found it there instead of posting again.
        The local server stores a post as it receives it, before any slow answer, so a
        look-up (which only follows a post call that ended, or a claim that expired) always
        sees it: the design's residual case (Slack storing a post after the look-up read the
        history) cannot happen here.
        """
        kept: dict[int, list[str]] = defaultdict(list)
        for channel in self.slack.channels():
            for message in self.slack.channel_messages(channel):
                meta = message.get("metadata") or {}
                if meta.get("event_type") == RELAY_EVENT_TYPE:
                    reply_id = int(meta["event_payload"]["reply_id"])
                    kept[reply_id].append(message["ts"])
        replies = list(
            Reply.objects.exclude(instruction="").values_list(
                "pk", "relay_status", "slack_ts", "message_ts"
            )
        )
        known = {pk for pk, *_ in replies}
        posted = inboxed = 0
        wrong: list[str] = []
        for pk, status, slack_ts, message_ts in replies:
            in_slack = kept.get(pk, [])
            if status == Reply.RelayStatus.POSTED and in_slack == [slack_ts]:
                posted += 1
            elif status == Reply.RelayStatus.INBOXED and message_ts and not in_slack:
                inboxed += 1
            else:
                wrong.append(f"reply {pk}: {status}, {len(in_slack)} in Slack")
        strays = sorted(set(kept) - known)
        lookups = self.slack.attempts("conversations.history")
        ambiguous = sum(
            1
            for call in self.slack.attempts()
            if call.status >= 500 or call.delay >= float(CLUSTER_SETTINGS["SLACK_TIMEOUT"])
        )
        return [
            Check(
                "every instruction posted exactly once or inboxed (never both, never lost)",
                not wrong and not strays and len(replies) > 0,
                f"{len(replies)} instructions: {posted} posted once, {inboxed} inboxed, "
                f"{len(wrong)} wrong{': ' + '; '.join(wrong[:5]) if wrong else ''}; "
                f"{len(strays)} posts of unknown replies",
            ),
            Check(
                "posts with an unknown outcome, looked up before any re-post",
                True,
                f"{ambiguous} posts answered 500 or after the timeout; "
                f"{len(lookups)} history look-ups ({sum(c.ok for c in lookups)} answered)",
                required=False,
            ),
        ]

    def _check_writer_slots(self) -> Check:
        """Per slot, the ids minted under each lease (its token) span an interval; two
        leases' intervals overlapping means two processes minted in one slot at once. A
        process may hold a slot, lose it when idle past the TTL, and lease it again later:
        those are separate leases, so the check goes by token, not by pid."""
        spans: dict[int, dict[str, list[int]]] = defaultdict(dict)
        pids: dict[int, set[int]] = defaultdict(set)
        for ts, metadata in Message.objects.filter(run_id=SYSTEM_RUN_ID).values_list(
            "ts", "metadata"
        ):
            value = parse_ts(ts)
            lease = str(metadata.get("token") or metadata["pid"])
            span = spans[value % 100].setdefault(lease, [value, value])
            span[0], span[1] = min(span[0], value), max(span[1], value)
            pids[value % 100].add(metadata["pid"])
        overlaps = []
        for slot, by_lease in spans.items():
            ordered = sorted(by_lease.items(), key=lambda item: item[1][0])
            for (lease_a, (_, end_a)), (lease_b, (start_b, _)) in pairwise(ordered):
                if start_b <= end_a:
                    overlaps.append((slot, lease_a, lease_b))
        fixed = sorted(set(spans) & {1, 2, 3})
        leases = sum(len(by_lease) for by_lease in spans.values())
        processes = sum(len(p) for p in pids.values())
        return Check(
            "no two live processes held one writer slot",
            not overlaps and not fixed,
            f"{len(spans)} slots, {leases} leases by {processes} processes in turn; "
            f"{len(overlaps)} overlapping leases; fixed writers' slots used: {fixed or 'none'}",
        )

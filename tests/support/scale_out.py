"""The scale-out rehearsal (issue 22.6), shared by bench/scale_out.py and
tests/system/test_scale_out.py.

Several hosts, one PostgreSQL, behind PgBouncer, as a multi-host deployment runs it:

- a PgBouncer in transaction pooling mode (tests/support/pgbouncer.py) in front of the
  database; every cluster's `DATABASE_URL` goes through it, only the wake-up listener's
  LISTEN goes direct (`LISTEN_DATABASE_URL`);
- three `manage.py qcluster` processes (2 django-q2 workers each), two of them under Debian's
  libfaketime with their wall clocks 5 minutes ahead and 5 minutes behind;
- the work: 5,000 jobs inserted by plain SQL (each run records one Message with a minted
  canonical id: tests/system/handlers.py), 500 PIs with a proposal each (the new-proposal
  sweep mails each one a notice, a file per mail: tests/support/folder_sender.py), and a
  reply with a rating from each of them dropped into the inbound mail folder (500 mails).

Then it checks that every job completed and was started once (one attempt, one Message),
every notice was mailed once, every mail was handled once (one ledger row, processed, one
Reply per notification, none left in the folder), and no canonical id was minted twice.
This module runs in a process with Django set up on the database the clusters use.
"""

from __future__ import annotations

import os
import subprocess
import time
from collections import Counter
from collections.abc import Callable
from dataclasses import dataclass, field
from pathlib import Path

import psycopg
from django.contrib.auth import get_user_model
from django.db import connection
from django_q.tasks import async_task

from canonical_ids.models import Message
from inbound_email.models import InboundEmail, Reply
from jobs.models import Job
from notifications.models import EmailNotification, NotificationPreference, Proposal
from ops.sample_mail import reply_mail
from tests.support.cluster import spawn_cluster, stop_cluster
from tests.support.folder_sender import sent_message_ids
from tests.support.pgbouncer import PgBouncer
from tests.support.processes import child_env, test_database_url
from tests.support.skew import skewed_env
from tests.system.handlers import SYSTEM_RUN_ID

JOB_KIND = "system.record"
APP_NAME = "scale-out-{}"


@dataclass
class ScaleOutSettings:
    jobs: int = 5000
    mails: int = 500
    skews: tuple[int, ...] = (0, 300, -300)  # one cluster per entry: its clock's offset (s)
    workers: int = 2  # django-q2 workers per cluster
    pool_size: int = 10  # PgBouncer's server connections to PostgreSQL
    pooled: bool = True  # False: the clusters connect directly (bench/scale_out.py's baseline)
    timeout: float = 600.0  # seconds for everything to be done


@dataclass
class Check:
    name: str
    ok: bool
    detail: str


@dataclass
class ScaleOutReport:
    settings: ScaleOutSettings
    done: bool = False
    seconds: dict[str, float] = field(default_factory=dict)  # phase -> wall seconds
    checks: list[Check] = field(default_factory=list)

    @property
    def failed(self) -> list[Check]:
        return [check for check in self.checks if not check.ok]

    def table(self) -> str:
        route = (
            f"through PgBouncer (transaction pooling, {self.settings.pool_size} server connections)"
            if self.settings.pooled
            else "connected directly"
        )
        lines = [
            f"scale-out rehearsal: {len(self.settings.skews)} clusters (clock offsets "
            f"{', '.join(f'{s:+d} s' for s in self.settings.skews)}) {route}, "
            f"{self.settings.workers} workers each",
            *(f"  {phase}: {seconds:.1f} s" for phase, seconds in self.seconds.items()),
            f"  all done: {'yes' if self.done else 'NO (timed out)'}",
        ]
        lines += [f"  [{'ok' if c.ok else 'FAIL'}] {c.name}: {c.detail}" for c in self.checks]
        return "\n".join(lines)


class ScaleOut:
    def __init__(
        self, config: ScaleOutSettings, workdir: Path, log: Callable[[str], None] = print
    ) -> None:
        self.config = config
        self.workdir = workdir
        self.log = log
        self.mail_folder = workdir / "inbound_mail"
        self.sent_folder = workdir / "sent_mail"
        self.replied: set[int] = set()
        self.clusters: list[subprocess.Popen] = []
        self.pooled_transactions = 0

    # --- the run ---------------------------------------------------------------------------
    def run(self) -> ScaleOutReport:
        report = ScaleOutReport(settings=self.config)
        self.mail_folder.mkdir(parents=True, exist_ok=True)
        self.sent_folder.mkdir(parents=True, exist_ok=True)
        direct = test_database_url()
        started = time.monotonic()
        self._make_pis()
        with PgBouncer(direct, pool_size=self.config.pool_size, max_clients=1000) as bouncer:
            env = child_env(
                DATABASE_URL=bouncer.url(direct) if self.config.pooled else direct,
                LISTEN_DATABASE_URL=direct,
                Q_WORKERS=str(self.config.workers),
                JOBS_EXTRA_HANDLER_MODULES="tests.system.handlers",
                CANONICAL_IDS_ROLE="worker",
                INBOUND_EMAIL_STORE=str(self.mail_folder),
                EMAIL_SENDER="tests.support.folder_sender.FolderSender",
                SENT_MAIL_DIR=str(self.sent_folder),
                SLACK_BOT_TOKEN="",
                LOG_LEVEL="WARNING",
            )
            try:
                for n, skew in enumerate(self.config.skews):
                    cluster_env = {**env, "PGAPPNAME": APP_NAME.format(n)}
                    if skew:
                        cluster_env = skewed_env(cluster_env, skew)
                    self.clusters.append(
                        spawn_cluster(cluster_env, self.workdir / f"cluster{n}.log")
                    )
                work_started = time.monotonic()
                self._insert_jobs()
                report.done = self._feed_until_done(work_started, report)
                report.seconds["work (jobs inserted → all done)"] = time.monotonic() - work_started
                self.pooled_transactions = bouncer.transactions(connection.settings_dict["NAME"])
            finally:
                for cluster in self.clusters:
                    stop_cluster(cluster)
        report.seconds["whole run"] = time.monotonic() - started
        report.checks = self._checks()
        return report

    def _make_pis(self) -> None:
        User = get_user_model()
        users = User.objects.bulk_create(
            User(username=f"scale-pi{n}", email=f"scale-pi{n}@example.org", is_active=True)
            for n in range(self.config.mails)
        )
        NotificationPreference.objects.bulk_create(
            NotificationPreference(user=user) for user in users
        )
        Proposal.objects.bulk_create(
            Proposal(
                title=f"Scale-out proposal {n}",
                pi=user,
                status=Proposal.Status.IN_REVIEW,
                run_id=f"scale-run-{n}",
                slack_channel=f"C{n:08d}",
            )
            for n, user in enumerate(users)
        )

    def _insert_jobs(self) -> None:
        """As another program writes them: one plain INSERT, woken by the trigger's NOTIFY."""
        with psycopg.connect(test_database_url(), autocommit=True) as conn:
            conn.execute(
                "INSERT INTO jobs_job (kind, payload, status, priority, attempts, max_attempts, "
                "run_after, created_at, locked_by, last_error) "
                "SELECT %s, jsonb_build_object('n', g), 'queued', 0, 0, 5, now(), now(), '', '' "
                "FROM generate_series(1, %s) AS g",
                [JOB_KIND, self.config.jobs],
            )

    def _feed_until_done(self, started: float, report: ScaleOutReport) -> bool:
        deadline = started + self.config.timeout
        while time.monotonic() < deadline:
            self._note_milestones(started, report)
            for cluster in self.clusters:
                if cluster.poll() is not None:
                    raise RuntimeError(f"a cluster exited ({cluster.returncode}): see its log")
            self._reply_to_new_notices()
            if self._done():
                return True
            # The schedules are minute-grained: wake the sweep and the poller as they would.
            for func in (
                "notifications.tasks.new_proposal_sweep",
                "inbound_email.tasks.poll_inbound_email",
            ):
                async_task(func)
            time.sleep(1.0)
        return False

    def _note_milestones(self, started: float, report: ScaleOutReport) -> None:
        milestones = {
            f"{self.config.jobs} jobs completed": lambda: (
                Job.objects.filter(kind=JOB_KIND, status=Job.Status.COMPLETED).count()
                == self.config.jobs
            ),
            f"{self.config.mails} notices mailed": lambda: len(self.replied) == self.config.mails,
        }
        for name, reached in milestones.items():
            if name not in report.seconds and reached():
                report.seconds[name] = time.monotonic() - started

    def _reply_to_new_notices(self) -> None:
        """A reply with a rating from each PI whose notice was sent, written to the folder
        store atomically (a rename into it)."""
        notices = EmailNotification.objects.filter(
            kind=EmailNotification.Kind.NEW_PROPOSAL, status=EmailNotification.Status.SENT
        ).exclude(pk__in=self.replied)
        for notice in notices:
            self.replied.add(notice.pk)
            raw = reply_mail(notice, "Rating: 4\n\nThanks.", message_id=f"scale{notice.pk}")
            partial = self.workdir / f"reply-{notice.pk}.eml"
            partial.write_bytes(raw)
            os.rename(partial, self.mail_folder / partial.name)

    def _done(self) -> bool:
        return (
            not Job.objects.filter(status__in=[Job.Status.QUEUED, Job.Status.PROCESSING]).exists()
            and Job.objects.filter(kind=JOB_KIND).count() == self.config.jobs
            and len(self.replied) == self.config.mails
            and InboundEmail.objects.filter(status__in=InboundEmail.TERMINAL_STATUSES).count()
            == self.config.mails
            and not self._intake_left()
        )

    def _intake_left(self) -> list[str]:
        return sorted(path.name for path in self.mail_folder.glob("*.eml"))

    # --- the checks ------------------------------------------------------------------------
    def _checks(self) -> list[Check]:
        return [
            self._check_pooled(),
            self._check_jobs(),
            self._check_notices(),
            self._check_mail(),
            self._check_ids(),
            self._check_logs(),
        ]

    def _check_logs(self) -> Check:
        """The clusters log at WARNING: an ERROR or CRITICAL line is something that went
        wrong even if every count above came out right (a drain killed by django-q2's
        Q_TIMEOUT holding jobs for minutes once did, the counts right in the end)."""
        lines = [
            f"{path.name}: {line.strip()[:200]}"
            for path in sorted(self.workdir.glob("cluster*.log"))
            for line in path.read_text(errors="replace").splitlines()
            if " ERROR " in line or " CRITICAL " in line
        ]
        return Check(
            "no cluster logged an error",
            not lines,
            f"{len(lines)} ERROR/CRITICAL lines" + (f", first: {lines[:3]}" if lines else ""),
        )

    def _check_pooled(self) -> Check:
        if not self.config.pooled:
            return Check("the clusters connected directly (baseline)", True, "no PgBouncer")
        return Check(
            "the clusters ran through PgBouncer",
            self.pooled_transactions >= self.config.jobs,
            f"{self.pooled_transactions} transactions passed through it",
        )

    def _check_jobs(self) -> Check:
        jobs = list(Job.objects.filter(kind=JOB_KIND).values_list("payload", "status", "attempts"))
        effects = Counter(
            Message.objects.filter(run_id=SYSTEM_RUN_ID).values_list("text", flat=True)
        )
        wrong = [
            (payload["n"], status, attempts, effects.get(f"job-{payload['n']}", 0))
            for payload, status, attempts in jobs
            if status != Job.Status.COMPLETED
            or attempts != 1
            or effects.get(f"job-{payload['n']}", 0) != 1
        ]
        ok = len(jobs) == self.config.jobs and not wrong
        return Check(
            "every job completed, started once, one effect",
            ok,
            f"{len(jobs) - len(wrong)}/{self.config.jobs} completed after one attempt with one "
            f"Message; {len(wrong)} wrong, first (n, status, attempts, effects): {wrong[:5]}",
        )

    def _check_notices(self) -> Check:
        """Each row the mail service accepted has exactly one mail (a second send of a row
        writes a second file under a new message id), and every PI's new-proposal notice
        went out (it is `responded` once the reply is handled)."""
        rows = EmailNotification.objects.exclude(ses_message_id="")
        notices = Counter(
            rows.filter(kind=EmailNotification.Kind.NEW_PROPOSAL).values_list("status", flat=True)
        )
        recorded = list(rows.values_list("ses_message_id", flat=True))
        kinds = Counter(rows.values_list("kind", flat=True))
        mailed = sent_message_ids(self.sent_folder)
        unrecorded = set(mailed) - set(recorded)
        ok = sum(notices.values()) == self.config.mails and sorted(mailed) == sorted(recorded)
        return Check(
            "every notice mailed once",
            ok,
            f"new-proposal notices mailed: {sum(notices.values())} ({dict(notices)}); "
            f"{len(mailed)} mails for {len(recorded)} rows the mail service accepted "
            f"({dict(kinds)}), {len(unrecorded)} mails no row records",
        )

    def _check_mail(self) -> Check:
        rows = Counter(InboundEmail.objects.values_list("status", flat=True))
        replies = Reply.objects.count()
        per_notice = Counter(Reply.objects.values_list("notification_id", flat=True))
        twice = [pk for pk, n in per_notice.items() if n > 1]
        left = self._intake_left()
        ok = (
            rows == {InboundEmail.Status.PROCESSED: self.config.mails}
            and replies == self.config.mails
            and not twice
            and not left
        )
        return Check(
            "every mail handled once",
            ok,
            f"ledger {dict(rows)}; {replies} replies, {len(twice)} notices answered twice; "
            f"{len(left)} left in the folder",
        )

    def _check_ids(self) -> Check:
        with connection.cursor() as cursor:
            cursor.execute(f"SELECT count(*), count(DISTINCT ts) FROM {Message._meta.db_table}")
            total, distinct = cursor.fetchone()
        return Check(
            "no canonical id minted twice", total == distinct, f"{total} ids, {distinct} distinct"
        )

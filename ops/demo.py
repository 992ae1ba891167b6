"""A guided tour of the worker on the embedded default, run by `manage.py demo`.

It goes through the same services the schedules call: the notification sweep sends real
mail (into files under var/sent_mail), replies are dropped into the mail store the poller
reads, jobs go through the runner. Each run uses fresh names, so running it twice is harmless.

It runs only on the embedded database the project manages (DB_IS_EMBEDDED): on any other
DATABASE_URL it would create fake PIs in a real database and mail them, so it is refused
before anything is written. Slack is off during the tour and the mail goes to files whatever
EMAIL_SENDER says, so nothing leaves the machine.
"""

from __future__ import annotations

import shlex
import sys
from collections.abc import Callable
from dataclasses import dataclass, field
from datetime import datetime
from pathlib import Path
from typing import Any

from django.contrib.auth import get_user_model
from django.db import transaction
from django.test.utils import override_settings
from django.urls import reverse
from django.utils import timezone
from django.utils.module_loading import import_string

from canonical_ids.models import Message
from inbound_email.conf import get_config as inbound_email_config
from inbound_email.models import InboundEmail
from inbound_email.stores import store_from_url
from jobs import enqueue, run_pending
from jobs.models import Job
from notifications.conf import get_config as notifications_config
from notifications.models import EmailNotification, NotificationPreference, Proposal
from ops.conf import get_config
from ops.sample_mail import reply_mail, unknown_8bit_reply
from ops.schedules import SCHEDULES

PI_NAMES = ("ada", "grace", "barbara", "frances", "radia", "hedy")
SAMPLE_REPLIES = (
    "a good rating",
    "an instruction",
    "charset=unknown-8bit",
    "a string rating",
    "an auto-reply",
    "a spoofed sender",
)


@dataclass
class DemoReport:
    started_at: datetime
    run_tag: str
    lines: list[str] = field(default_factory=list)

    def add(self, line: str = "") -> None:
        self.lines.append(line)

    def text(self) -> str:
        return "\n".join(self.lines)


class DemoRefused(Exception):
    """The configured database is not the embedded one: the demo would write to it."""


def run_demo() -> DemoReport:
    """The tour, refused unless the database is the embedded one. Its mail goes to files
    (console email would bury the report under the mails; a real sender would send them) and
    Slack is off (its demo proposals have no channel)."""
    config = get_config()
    if not config.db_is_embedded:
        raise DemoRefused(
            "the demo runs only on the embedded PostgreSQL (DATABASE_URL unset): it would "
            "create fake PIs and mail them in this database; nothing was written"
        )
    outbox = config.var_dir / "sent_mail"
    outbox.mkdir(mode=0o700, parents=True, exist_ok=True)
    with override_settings(
        EMAIL_SENDER="django",
        EMAIL_BACKEND="django.core.mail.backends.filebased.EmailBackend",
        EMAIL_FILE_PATH=str(outbox),
        SLACK_BOT_TOKEN="",
    ):
        report = _run_demo()
    where = next(i for i, line in enumerate(report.lines) if line.startswith("Next steps"))
    report.lines[where:where] = [f"The notification mails are in {outbox}/.", ""]
    _keep_next_steps(config.var_dir, report.lines[where + 2 :])
    return report


def _next_steps_file(var_dir: Path) -> Path:
    return var_dir / "demo-next-steps.txt"


def _keep_next_steps(var_dir: Path, lines: list[str]) -> None:
    """For the worker's first start after the demo (scripts/run-worker starts it next): its
    start-up lines pushed the report's next steps off the screen (issue 36.8), so the
    qcluster prints them again once it runs (`print_next_steps_again`)."""
    path = _next_steps_file(var_dir)
    path.write_text("\n".join(lines) + "\n")
    path.chmod(0o600)


def print_next_steps_again(var_dir: Path, write: Callable[[str], Any]) -> None:
    """The demo's next steps, once, after the cluster's start-up lines (then forgotten)."""
    path = _next_steps_file(var_dir)
    try:
        steps = path.read_text()
    except FileNotFoundError:
        return
    path.unlink()
    write("")
    write("The demo's next steps again (the worker runs now; Ctrl-C stops it):")
    write(steps.rstrip("\n"))


def _run_demo() -> DemoReport:
    now = timezone.now()
    tag = now.strftime("%Y%m%d%H%M%S")
    report = DemoReport(started_at=now, run_tag=tag)
    User = get_user_model()

    # 1. PIs and proposals in review: the new-proposal sweep owes each PI a notice.
    with transaction.atomic():
        pis = []
        for name in PI_NAMES:
            pi = User.objects.create_user(
                username=f"{name}-{tag}", email=f"{name}.{tag}@example.org", password=None
            )
            NotificationPreference.objects.create(user=pi)
            Proposal.objects.create(
                title=f"{name.title()}'s grant proposal",
                pi=pi,
                status=Proposal.Status.IN_REVIEW,
                run_id=f"demo-run-{name}-{tag}",
            )
            pis.append(pi)
    import_string("notifications.tasks.new_proposal_sweep")()
    notices = list(
        EmailNotification.objects.filter(
            user__in=pis, kind=EmailNotification.Kind.NEW_PROPOSAL
        ).select_related("proposal")
    )
    notices.sort(key=lambda n: PI_NAMES.index(n.user.username.rsplit("-", 1)[0]))

    # 2. Sample replies, dropped where SES would put them.
    store = store_from_url()
    samples = {
        "a good rating": reply_mail(notices[0], "5", message_id=f"demo-{tag}-0"),
        "an instruction": reply_mail(
            notices[1],
            "Rating: 4/5\n\nPlease add the pilot data to aim 2.",
            message_id=f"demo-{tag}-1",
        ),
        "charset=unknown-8bit": unknown_8bit_reply(
            notices[2], "Rating: 5\nMerci, très bien.\n", message_id=f"demo-{tag}-2"
        ),
        "a string rating": reply_mail(notices[3], "Rating: excellent", message_id=f"demo-{tag}-3"),
        "an auto-reply": reply_mail(
            notices[4],
            "I am out of the office.",
            message_id=f"demo-{tag}-4",
            **{"Auto-Submitted": "auto-replied"},
        ),
        "a spoofed sender": reply_mail(
            notices[5], "Rating: 1", message_id=f"demo-{tag}-5", From="mallory@evil.example"
        ),
    }
    keys = {}
    for index, (label, raw) in enumerate(samples.items()):
        keys[label] = f"demo-{tag}-{index}.eml"
        store.put(keys[label], raw)

    # 3. Jobs: one succeeds, one fails with a database error (the user it inserts exists) and
    #    is retried with backoff; the cause is removed below, so its retry completes.
    with transaction.atomic():
        clash = User.objects.create_user(username=f"taken-{tag}", password=None)
        ok_job = enqueue("demo.greet", {"username": pis[0].username, "first_name": "Ada"})
        bad_job = enqueue("demo.duplicate_user", {"username": clash.username})

    # 4. One pass of every schedule, as the qcluster would run them, then one more drain of
    #    the jobs that pass created (the relay of the instructions the poll accepted).
    for spec in SCHEDULES:
        import_string(spec.func)()
    run_pending()

    _write_report(report, pis, notices, keys, ok_job.pk, bad_job.pk)
    # As an operator would: fix the cause, let the retry succeed. A fresh install's health
    # page is then green once the retry ran, not red forever with the demo's failure.
    clash.delete()
    return report


def _write_report(report, pis, notices, keys, ok_job_id: int, bad_job_id: int) -> None:
    add = report.add
    add("=" * 72)
    add(f"Demo run {report.run_tag}: what the worker just did")
    add("=" * 72)
    add("")
    config = get_config()
    sender = notifications_config().email_sender
    add(f"Notifications sent ({sender} sender, {config.email_backend}):")
    # Every mail to the demo's PIs: the notices, then what its pass of the schedules sent
    # (the review requests, the rejection notice), which the log reports too.
    for notice in EmailNotification.objects.filter(user__in=pis).order_by("pk"):
        add(f"  #{notice.pk} {notice.kind:<15} to {notice.to_address:<38} {notice.status}")
    add("")
    add(f"Inbound mail (store: {inbound_email_config().store_url}):")
    rows = {row.store_key: row for row in InboundEmail.objects.filter(store_key__in=keys.values())}
    for label, key in keys.items():
        row = rows.get(key)
        if row is None:
            add(f"  {label:<22} not seen yet (the next poll picks it up)")
            continue
        why = f" — {row.get_reason_display()}: {row.detail}" if row.reason else ""
        add(f"  {label:<22} {row.status}{why}")
    inbox = Message.objects.filter(run_id__in=[n.proposal.run_id for n in notices])
    add("")
    add("Database inbox (Slack is off, so PI instructions land here with a canonical id):")
    for message in inbox.order_by("ts"):
        add(f"  {message.ts}  {message.run_id}: {cut_at_word(message.text, 60)!r}")
    if not inbox.exists():
        add("  (none)")
    add("")
    add("Jobs:")
    for job in Job.objects.filter(pk__in=[ok_job_id, bad_job_id]).order_by("pk"):
        line = (
            f"  #{job.pk} {job.kind:<20} {job.status} (attempt {job.attempts}/{job.max_attempts})"
        )
        if job.status == Job.Status.QUEUED and job.last_error:
            line += f", retry after {job.run_after:%H:%M:%S}"
        add(line)
        if job.last_error:
            add(f"      last error: {cut_at_word(job.last_error.splitlines()[0], 100)}")
    add("")
    clash = Job.objects.get(pk=bad_job_id).payload["username"]
    add(f"  (the demo then removes user {clash}, the cause of the failure: the retry")
    add("   completes, as after an operator's fix)")
    add("")
    python = _python()
    prefix = f"cd {shlex.quote(str(config.base_dir))} && "
    if config.var_dir.resolve() != (config.base_dir / "var").resolve():
        prefix += f"WORKER_VAR_DIR={shlex.quote(str(config.var_dir))} "
    add("Next steps, in another terminal while scripts/run-worker runs (paste as printed):")
    add(f"  $ {prefix}{python} manage.py createsuperuser")
    add(f"  $ {prefix}{python} manage.py runserver")
    add("then log in and open the Worker health page (what needs an operator, 24 h charts):")
    site = "http://127.0.0.1:8000"
    add(f"  {site}{reverse('ops:worker_health'):<46} Worker health")
    add(f"  {site}{reverse('admin:jobs_job_changelist'):<46} jobs (retry now, cancel)")
    mail = reverse("admin:inbound_email_inboundemail_changelist")
    add(f"  {site}{mail:<46} mail (quarantine, reprocess)")
    notifications = reverse("admin:notifications_emailnotification_changelist")
    add(f"  {site}{notifications:<46} notifications")
    add(f"  {site}{reverse('admin:canonical_ids_message_changelist'):<46} the database inbox")
    add("and the operator's summary in the terminal:")
    add(f"  $ {prefix}{python} manage.py worker_status")


def cut_at_word(text: str, width: int) -> str:
    """`text` in at most `width` characters: whole, or cut at the last space that fits,
    with an ellipsis (issue 36.8: a cut mid-word read as a garbled name)."""
    if len(text) <= width:
        return text
    space = text.rfind(" ", 0, width)
    head = text[:space] if space > 0 else text[: width - 1]
    return head.rstrip() + "…"


def _python() -> str:
    """The interpreter running the demo (the project's .venv under scripts/run-worker), as a
    path that works without the venv activated: relative to manage.py's folder if inside."""
    executable = Path(sys.executable)
    base = get_config().base_dir
    try:
        return shlex.quote(str(executable.relative_to(base)))
    except ValueError:
        return shlex.quote(str(executable))

"""The Job row: the durable source of truth of the job loop (django-q2 tasks only wake it)."""

from __future__ import annotations

from datetime import UTC, datetime, timedelta

from django.contrib.postgres.fields import ArrayField
from django.contrib.postgres.indexes import GinIndex
from django.db import models
from django.db.models import F, Func, Q, Value
from django.db.models.functions import Now
from django.db.models.lookups import Exact

# The timestamps Python (and so every reader: the runner's claim, worker_status, the admin)
# can load: PostgreSQL also stores 'infinity', '-infinity' and years past 9999 or BC, which
# psycopg refuses to load, so one such row failed every query that read it (a due
# '-infinity' row stopped every claim). A day inside Python's range on either side, so a
# value survives conversion to any time zone.
EARLIEST = datetime(1, 1, 2, tzinfo=UTC)
LATEST = datetime(9999, 12, 30, tzinfo=UTC)


class Job(models.Model):
    class Status(models.TextChoices):
        QUEUED = "queued", "Queued"
        PROCESSING = "processing", "Processing"
        COMPLETED = "completed", "Completed"
        FAILED = "failed", "Failed"
        CANCELLED = "cancelled", "Cancelled"

    kind = models.CharField(max_length=100)
    payload = models.JSONField(default=dict, blank=True)
    status = models.CharField(max_length=20, choices=Status.choices, default=Status.QUEUED)
    priority = models.IntegerField(default=0, help_text="Higher runs first.")
    # Counted when a worker claims the row, so a job that kills its worker still runs out.
    attempts = models.PositiveIntegerField(default=0)
    max_attempts = models.PositiveIntegerField()
    # Issue 38, point 2: how often a handler raised jobs.Snooze for this job. A snooze gives
    # its attempt back (max_attempts counts real failures); this bounds the snoozes instead
    # (JOBS_MAX_SNOOZES). A plain integer with a database default: no rewrite, no check to
    # validate over the table when the column is added.
    snoozes = models.IntegerField(default=0, db_default=0, editable=False)
    # The database's clock, whoever inserts the row (hosts' clocks may differ by minutes).
    run_after = models.DateTimeField(db_default=Now())
    created_at = models.DateTimeField(db_default=Now())
    started_at = models.DateTimeField(null=True, blank=True, help_text="Start of the last attempt.")
    heartbeat_at = models.DateTimeField(null=True, blank=True)
    lease_expires_at = models.DateTimeField(
        null=True, blank=True, help_text="After this the reaper may reclaim a processing row."
    )
    locked_by = models.CharField(
        max_length=200, blank=True, help_text="The worker run that owns the processing row."
    )
    completed_at = models.DateTimeField(null=True, blank=True, help_text="Set on success only.")
    failed_at = models.DateTimeField(null=True, blank=True)
    cancelled_at = models.DateTimeField(null=True, blank=True)
    # Issue 37, point 8: an operator cancelled the job while it ran. Its worker's keeper
    # sees it (jobs/stopping.py) and asks the handler to stop; the job ends `cancelled` once
    # the handler has stopped (or, its process dead, when the reaper takes it).
    cancel_requested_at = models.DateTimeField(null=True, blank=True)
    last_error = models.TextField(blank=True)
    # Which error group a failed row is in (jobs.error_groups): the md5 of its kind, exception
    # class and normalised message, written by the database's trigger (migration 0008) whenever
    # a row is failed or a failed row's kind or error changes, whoever writes it; never by
    # Python. Meaningful only while status is failed (a retried row keeps a stale one).
    error_group = models.CharField(
        max_length=32,
        blank=True,
        db_default="",
        editable=False,
        help_text="While failed: md5 of kind, exception class and normalised message "
        "(set by the database, migration 0008).",
    )
    # Issue 38: a producer's dedupe key (with how long it outlives the job's completion), its
    # tags and metadata. NULL when not given: a job without them stores no bytes for them
    # and enters none of their partial indexes, so the claim and completion of such a job
    # pay only the indexes' predicates (docs/jobs.md, "Unique jobs").
    unique_key = models.CharField(
        max_length=255,
        null=True,
        blank=True,
        help_text="While queued or processing, no other job of this kind has this key.",
    )
    unique_for = models.DurationField(
        null=True, blank=True, help_text="How long the key stays taken after completion."
    )
    tags = ArrayField(models.CharField(max_length=100), null=True, blank=True)
    meta = models.JSONField(null=True, blank=True, help_text="A producer's JSON object.")

    class Meta:
        indexes = [
            # Serves the claim: WHERE status='queued' AND run_after <= now ORDER BY priority DESC,
            # run_after, id. Partial, so it stays small however many finished rows accumulate.
            models.Index(
                fields=["-priority", "run_after", "id"],
                name="jobs_job_claim_idx",
                condition=Q(status="queued"),
            ),
            # Serves the claim since issue 36 (jobs_runner_step_v5): one range per lane
            # (JobLane), kind and priority equal, run_after between the floor and now. A
            # lane that may not run (a paused kind) is not asked, so its backlog costs
            # nothing; the index above stays for the previous release's claim. The priority
            # is keyed negated (highest first, as the claim orders) and the lane scans ask
            # for `priority * -1`: a plain `priority =` would bound the index above as well,
            # and where the statistics know one kind only, the planner took that one and
            # read the paused kind's rows with a filter.
            models.Index(
                F("kind"),
                F("priority") * -1,
                F("run_after"),
                F("id"),
                name="jobs_job_lane_idx",
                condition=Q(status="queued"),
            ),
            # Serves the claim's count of a capped kind's units in use (issue 37, point 2;
            # migration 0021): its processing rows only, whatever its queued backlog.
            models.Index(
                fields=["kind"],
                name="jobs_job_running_kind_idx",
                condition=Q(status="processing"),
            ),
            # Serves the reaper (expired leases) without scanning finished rows.
            models.Index(
                fields=["lease_expires_at"],
                name="jobs_job_lease_idx",
                condition=Q(status="processing"),
            ),
            # Serves pruning and the admin's per-status counts of finished rows. Partial
            # (migration 0018): a queued or running row has its own partial indexes above,
            # and here it only cost two more index entries per job (its queued and its
            # processing version) and, next to a pinned snapshot, gave the planner a way to
            # scan the queued rows that walks every dead entry the snapshot keeps.
            models.Index(
                fields=["status", "completed_at"],
                name="jobs_job_finished_idx",
                condition=Q(status__in=["completed", "failed", "cancelled"]),
            ),
            # The error groups page (GROUP BY error_group: count, first and last seen, one
            # row's id) and a group's jobs, from the index alone; partial, so only failed rows
            # pay for it (issue 20, bench/console.py).
            models.Index(
                fields=["error_group", "failed_at"],
                include=["id"],
                name="jobs_job_error_group_idx",
                condition=Q(status="failed"),
            ),
            # The health page's failures per minute (failed_at over the last 24 h).
            models.Index(
                fields=["failed_at"], name="jobs_job_failed_at_idx", condition=Q(status="failed")
            ),
            # Issue 38: pruning cancelled rows by age; only cancelled rows enter it.
            models.Index(
                fields=["cancelled_at"],
                name="jobs_job_cancelled_at_idx",
                condition=Q(status="cancelled"),
            ),
            # Issue 38: the admin's tag filter and exact meta search (`meta @> {...}`), only
            # for jobs that have them.
            GinIndex(fields=["tags"], name="jobs_job_tags_idx", condition=Q(tags__isnull=False)),
            GinIndex(
                fields=["meta"],
                name="jobs_job_meta_idx",
                opclasses=["jsonb_path_ops"],
                condition=Q(meta__isnull=False),
            ),
        ]
        constraints = [
            models.CheckConstraint(
                condition=Q(attempts__lte=models.F("max_attempts")),
                name="jobs_job_attempts_lte_max",
            ),
            models.CheckConstraint(
                condition=Q(completed_at__isnull=True) | Q(status="completed"),
                name="jobs_job_completed_at_only_when_completed",
            ),
            # The rules below stop a plain INSERT from another producer (docs/jobs.md) with
            # a value the loop could never handle: each such row used to stay forever
            # without anybody being told (or, for the timestamps, stopped the whole queue).
            models.CheckConstraint(
                condition=Q(
                    status__in=["queued", "processing", "completed", "failed", "cancelled"]
                ),
                name="jobs_job_status_known",
            ),
            models.CheckConstraint(
                condition=Q(max_attempts__gte=1), name="jobs_job_max_attempts_positive"
            ),
            models.CheckConstraint(
                # Without a lease the reaper never reclaims the row if its worker dies.
                condition=~Q(status="processing") | Q(lease_expires_at__isnull=False),
                name="jobs_job_processing_has_lease",
            ),
            models.CheckConstraint(
                # Handlers take a dict; a JSON null, list or scalar can never succeed.
                condition=Exact(
                    Func(F("payload"), function="jsonb_typeof", output_field=models.TextField()),
                    Value("object"),
                ),
                name="jobs_job_payload_is_object",
            ),
            models.CheckConstraint(
                condition=Q(run_after__range=(EARLIEST, LATEST)),
                name="jobs_job_run_after_in_range",
            ),
            models.CheckConstraint(
                condition=Q(created_at__range=(EARLIEST, LATEST)),
                name="jobs_job_created_at_in_range",
            ),
            # Issue 38, unique jobs: one live job per (kind, key), decided by the database
            # (`INSERT … ON CONFLICT` names this index; migration 0020's jobs_enqueue_unique
            # uses it). Partial: a job without a key, or a finished one, is not in it.
            models.UniqueConstraint(
                fields=["kind", "unique_key"],
                name="jobs_job_unique_key",
                condition=Q(unique_key__isnull=False, status__in=["queued", "processing"]),
            ),
            models.CheckConstraint(
                condition=Q(meta__isnull=True)
                | Exact(
                    Func(F("meta"), function="jsonb_typeof", output_field=models.TextField()),
                    Value("object"),
                ),
                name="jobs_job_meta_is_object",
            ),
            models.CheckConstraint(
                condition=Q(unique_for__isnull=True)
                | Q(unique_key__isnull=False, unique_for__gt=timedelta(0)),
                name="jobs_job_unique_for_positive_with_key",
            ),
        ]

    def __str__(self) -> str:
        return f"job #{self.pk} {self.kind} ({self.status})"


class JobAttempt(models.Model):
    """One attempt of a job: who ran it, when, how it ended (issue 20, the job's history).

    Written only by the triggers of migration 0004, in the same transaction as the claim
    (an attempt starts: `queued` -> `processing`) and as the completion, failure, reaping or
    release that ends it, whichever code path or producer wrote it. No foreign key: another
    producer may delete job rows with plain SQL; a trigger deletes a job's attempts with it.
    """

    class Outcome(models.TextChoices):
        RUNNING = "running", "Running"
        COMPLETED = "completed", "Completed"
        RETRIED = "retried", "Failed, retried"
        FAILED = "failed", "Failed for good"
        RELEASED = "released", "Given back unstarted (not counted)"
        SNOOZED = "snoozed", "Snoozed (not counted)"
        CANCELLED = "cancelled", "Cancelled"

    job_id = models.BigIntegerField()
    number = models.PositiveIntegerField()  # the job's `attempts` after the claim
    worker = models.CharField(max_length=200)  # the run that held it: host:pid:random
    started_at = models.DateTimeField(null=True)
    finished_at = models.DateTimeField(null=True)
    outcome = models.CharField(max_length=20, choices=Outcome.choices, default=Outcome.RUNNING)
    error = models.TextField(blank=True, default="")

    class Meta:
        ordering = ["job_id", "number", "id"]
        indexes = [models.Index(fields=["job_id", "number"], name="jobs_attempt_job_idx")]

    def __str__(self) -> str:
        return f"job #{self.job_id} attempt {self.number} ({self.outcome})"

    @property
    def error_head(self) -> str:
        """The error's first line (the exception), for a folded traceback's summary."""
        first = self.error.split("\n", 1)[0]
        return first if len(first) <= 120 else first[:117] + "..."

    @property
    def duration_seconds(self) -> float | None:
        if self.started_at and self.finished_at:
            return (self.finished_at - self.started_at).total_seconds()
        return None


class JobLane(models.Model):
    """A (kind, priority) that has had a queued job, written by the jobs table's trigger
    (migration 0016) whoever inserts the job: the claim asks each lane that may run for its
    due rows, one range of jobs_job_lane_idx each, and never walks the rows of a lane held
    back (a paused kind; issue 36, point 1). Never updated; a lane with no queued row costs
    a claim one index descent. Not unique: a unique lane would make a second producer of a
    brand-new lane wait for the first one's transaction (the conflicting row is not
    committed yet), so two transactions that queue the first jobs of a lane at once may each
    write it, and the readers take the distinct lanes."""

    kind = models.CharField(max_length=100)
    priority = models.IntegerField()

    class Meta:
        indexes = [models.Index(fields=["kind", "priority"], name="jobs_joblane_kind_priority")]

    def __str__(self) -> str:
        return f"{self.kind} (priority {self.priority})"


class PausedKind(models.Model):
    """A job kind an operator paused: its jobs stay queued, the claim skips them (issue 20)."""

    kind = models.CharField(max_length=100, primary_key=True)
    paused_at = models.DateTimeField(auto_now_add=True)
    paused_by = models.CharField(max_length=150, blank=True, default="")
    note = models.CharField(max_length=300, blank=True, default="")

    class Meta:
        ordering = ["kind"]

    def __str__(self) -> str:
        return f"{self.kind} (paused)"


class KindCap(models.Model):
    """The most jobs of a kind `processing` at once, across every process and host (issue 37,
    point 2): `@handler(kind, concurrency=N)`. Code is the source: each worker writes its
    registry's caps here at start-up and removes the rows of kinds it has no cap for
    (jobs/kind_caps.py); an operator does not edit them. The claim (`jobs_runner_step_v5`,
    migration 0022) reads them and takes at most the free units of a capped kind, under a
    per-kind advisory lock; a kind at its cap is not scanned at all. No row is written per
    job (no hot row): the units in use are counted from the processing rows.
    """

    kind = models.CharField(max_length=100, primary_key=True)
    concurrency = models.PositiveIntegerField()
    updated_at = models.DateTimeField(db_default=Now())

    class Meta:
        ordering = ["kind"]
        constraints = [
            models.CheckConstraint(
                condition=Q(concurrency__gte=1), name="jobs_kindcap_concurrency_positive"
            )
        ]

    def __str__(self) -> str:
        return f"{self.kind}: at most {self.concurrency} at once"


class KindRate(models.Model):
    """The most jobs of a kind started per second, minute or hour, across every process and
    host (issue 38, point 3): `@handler(kind, rate="20/s")`. Code is the source: each worker
    writes its registry's rates here at start-up (jobs/kind_rates.py). The row is also the
    kind's token bucket, the send-rate bucket's design (notifications/pacing.py): the claim
    that takes a job of the kind moves `next_slot_at` one interval on (migration 0025), so
    the row is written at most at its rate, and never for a job of an unlimited kind.
    """

    kind = models.CharField(max_length=100, primary_key=True)
    rate = models.CharField(max_length=30, help_text='As the handler says it: "20/s", "3/h".')
    interval_seconds = models.FloatField(help_text="Seconds between two tokens.")
    next_slot_at = models.DateTimeField(
        null=True, blank=True, help_text="The token bucket: no job of the kind starts before."
    )
    floor_at = models.DateTimeField(
        null=True,
        blank=True,
        help_text="The run_after of the last job the bucket gave a token to: what waits lies "
        "at or after it, so the claim scans the kind's lanes from there.",
    )
    updated_at = models.DateTimeField(db_default=Now())

    class Meta:
        ordering = ["kind"]
        constraints = [
            models.CheckConstraint(
                condition=Q(interval_seconds__gt=0), name="jobs_kindrate_interval_positive"
            )
        ]

    def __str__(self) -> str:
        return f"{self.kind}: at most {self.rate}"


class JobCount(models.Model):
    """How many job rows have each (kind, status), as of the last rollup: the admin,
    worker_status and the health page read counts without scanning a million rows (issue
    20, bench/console.py). Since migration 0011 (issue 32) the triggers append JobCountDelta
    rows and `jobs_count_rollup()` adds them here every few seconds (shard 0); rows of shards
    1-15 were written per statement by the triggers before it. Sum over shards, plus the
    pending deltas, to read (jobs.selectors).
    """

    kind = models.CharField(max_length=100)
    status = models.CharField(max_length=20)
    shard = models.SmallIntegerField()
    n = models.BigIntegerField(default=0)

    class Meta:
        constraints = [
            models.UniqueConstraint(
                fields=["kind", "status", "shard"], name="jobs_jobcount_kind_status_shard"
            )
        ]

    def __str__(self) -> str:
        return f"{self.kind}/{self.status}#{self.shard}: {self.n}"


class JobCountDelta(models.Model):
    """One statement's change to the count of one (kind, status), appended by the statement
    triggers of migration 0011 in the transaction of every INSERT, UPDATE and DELETE of
    jobs_job (issue 32). Append-only: no job's path updates a row another job writes, so a
    snapshot held for minutes elsewhere piles no versions on a shared row. The rollup
    (`ops.rollups.counters_roll_up`, every few seconds) moves the rows into JobCount; readers sum
    both (jobs.selectors), so counts stay exact between rollups.
    """

    kind = models.CharField(max_length=100)
    status = models.CharField(max_length=20)
    n = models.BigIntegerField()

    def __str__(self) -> str:
        return f"{self.kind}/{self.status}: {self.n:+d}"


class JobUniqueKey(models.Model):
    """A key that stays taken after its job completed, until `expires_at` (issue 38, point
    1: `enqueue(…, unique_key=…, unique_for=seconds)`). Written by the jobs table's trigger
    (migration 0020) in the completion's transaction, whoever completes the job; read by
    `jobs_enqueue_unique` and enqueue_many; outlives the pruning of its job (no foreign
    key); pruned once expired (jobs.pruning)."""

    kind = models.CharField(max_length=100)
    unique_key = models.CharField(max_length=255)
    job_id = models.BigIntegerField()
    expires_at = models.DateTimeField()

    class Meta:
        constraints = [
            models.UniqueConstraint(
                fields=["kind", "unique_key"], name="jobs_jobuniquekey_kind_key"
            )
        ]
        indexes = [models.Index(fields=["expires_at"], name="jobs_jobuniquekey_expires")]

    def __str__(self) -> str:
        return f"{self.kind} {self.unique_key!r} until {self.expires_at:%Y-%m-%d %H:%M:%S}"


class JobPruneRun(models.Model):
    """What one pruning run deleted (issue 38, point 6), for the health page: one row a run,
    kept JOBS_PRUNE_RUNS_KEPT_DAYS (jobs.pruning)."""

    ran_at = models.DateTimeField(db_default=Now())
    completed = models.BigIntegerField(default=0)
    failed = models.BigIntegerField(default=0)
    cancelled = models.BigIntegerField(default=0)
    unique_keys = models.BigIntegerField(default=0)
    periodic_ticks = models.BigIntegerField(default=0, db_default=0)
    seconds = models.FloatField(default=0)

    class Meta:
        ordering = ["-ran_at", "-id"]
        indexes = [models.Index(fields=["ran_at"], name="jobs_jobprunerun_ran_at")]

    def __str__(self) -> str:
        return f"prune at {self.ran_at:%Y-%m-%d %H:%M}"


class JobStop(models.Model):
    """A job its runner stopped (issue 37, points 6 and 8): a timeout, or a cancel while it
    ran. One row per stopped attempt, written in the transaction that records the attempt's
    end (or, for a handler that never returned, the one that gives it up to the reaper);
    the health page, worker_status and /metrics count the last hour's per kind through the
    `at` index. Rare by nature; pruned after a day with the other finished rows
    (jobs/pruning.py)."""

    class Reason(models.TextChoices):
        TIMEOUT = "timeout", "Timed out"
        CANCEL = "cancel", "Cancelled while running"

    job_id = models.BigIntegerField()
    attempt = models.PositiveIntegerField()
    kind = models.CharField(max_length=100)
    reason = models.CharField(max_length=10, choices=Reason.choices)
    at = models.DateTimeField(db_default=Now())

    class Meta:
        indexes = [models.Index(fields=["at"], name="jobs_jobstop_at_idx")]

    def __str__(self) -> str:
        return f"job #{self.job_id} attempt {self.attempt}: {self.reason}"

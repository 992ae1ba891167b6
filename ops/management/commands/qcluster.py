"""django-q2's qcluster, preceded by `ensure_schedules()` so the schedules always match code
and by `kind_caps_sync()` so the caps per job kind do (jobs/kind_caps.py), and followed by
the job wake-up listener in this (the cluster's main) process, beside its process beacon,
the counter rollup every OPS_ROLLUP_SECONDS (ops/rollup_ticker.py) and the `jobs.periodic`
schedules' ticks (jobs/periodic_scheduler.py)."""

import os

from django.conf import settings
from django.core.exceptions import ImproperlyConfigured
from django.core.management.base import CommandError
from django.db import connections
from django_q.cluster import Cluster
from django_q.management.commands.qcluster import Command as DjangoQClusterCommand

from jobs import cluster_stop, floor_hints, linger_signal, pusher_signal, registry
from jobs.kind_caps import kind_caps_line, kind_caps_sync
from jobs.kind_rates import kind_rates_line, kind_rates_sync
from jobs.periodic_scheduler import periodic_scheduler_running
from jobs.periodic_ticks import checked_schedules
from jobs.registry import check_timeouts
from jobs.wakeup import WakeListener
from ops.conf import get_config
from ops.demo import print_next_steps_again
from ops.rollup_ticker import rollup_ticker_running
from ops.schedules import disable_unknown_schedules, disabled_line, ensure_schedules
from processes.beacon import beacon_running


class Command(DjangoQClusterCommand):
    help = (
        "Create/correct the schedules, start the django-q2 cluster, then listen for due jobs "
        "(NOTIFY jobs_job_due) and wake the cluster's runner."
    )

    def handle(self, *args, **options):
        try:  # each kind's timeout must fit inside Q_TIMEOUT (issue 37, point 6): one line
            check_timeouts()
        except ImproperlyConfigured as exc:
            raise CommandError(f"configuration error: {exc}") from exc
        counts = ensure_schedules()
        self.stdout.write(
            "schedules: {created} created, {updated} updated, {unchanged} unchanged".format(
                **counts
            )
        )
        for schedule in disable_unknown_schedules():
            self.stdout.write(disabled_line(schedule))
        # Slots a kind keeps for itself must fit the slots (issue 37, point 3).
        registry.check_reservations_at_start()
        # The handlers' caps per kind, as this release's code says (issue 37, point 2).
        self.stdout.write(kind_caps_line(kind_caps_sync()))
        self.stdout.write(kind_rates_line(kind_rates_sync()))  # issue 38, point 3
        # The `jobs.periodic` schedules, each kind with a handler, or no start (issue 38).
        schedules = checked_schedules()
        self.stdout.write(f"periodic schedules: {len(schedules)}")
        settings.SECRET_KEY  # noqa: B018 - as django-q2's command: refuse to start without it
        if options.get("cluster_name"):  # as django-q2's command: the broker's queue name
            os.environ["Q_CLUSTER_NAME"] = options["cluster_name"]
        # django-q2's command, spelled out so this process can listen once the cluster runs.
        # The listener's connection is opened after the sentinel forked, so no child
        # inherits it; Ctrl-C / SIGTERM go to django-q2's handler, which stops the cluster,
        # and the listener ends with it.
        linger_signal.open_signal()  # before the fork: every worker inherits the pipe
        pusher_signal.open_signal()  # and the pusher its own (issue 37, point 1)
        floor_hints.open_hints()  # likewise the listener's hints to the claimers' floors
        cluster_stop.open_flag()  # and the stop its drains read (issue 37, point 9)
        # Nor may any child inherit this process's database connection (ensure_schedules
        # opened it): a child that closes its copy closes the server's session under this
        # process, and the listener's first wake task failed on it at every start.
        connections.close_all()
        cluster = Cluster()
        cluster.start()
        # SIGTERM / Ctrl-C: the drains stop claiming and give their slots a grace first.
        cluster_stop.tell_workers_on_signals()
        if options.get("run_once", False):
            cluster.stop()
            return
        listener = WakeListener(workers=get_config().cluster_workers)
        # Registered after the sentinel forked (no child inherits the beat thread); each
        # worker process registers itself on post_spawn (processes.apps). The counter
        # rollup's thread likewise (issue 32, point 3: the readers sum few deltas).
        # And the periodic schedules' loop: this process lives for the cluster's whole run.
        with (
            beacon_running(role="qcluster"),
            rollup_ticker_running(),
            periodic_scheduler_running(schedules),
        ):
            # After the start-up lines, on a first start after the demo (issue 36.8).
            print_next_steps_again(get_config().var_dir, self.stdout.write)
            listener.run(should_stop=lambda: not cluster.sentinel.is_alive())

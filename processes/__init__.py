"""Live processes: every qcluster, django-q2 worker and service loop registers itself and
heartbeats on the database clock, so the operator sees what runs, where, and on what."""

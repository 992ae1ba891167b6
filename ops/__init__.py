"""Operator entry points that span apps: schedules, the qcluster wrapper, status, demo."""

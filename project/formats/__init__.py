"""Date formats for every page (FORMAT_MODULE_PATH): ISO 8601, UTC, with seconds.

Django's English defaults ("Dec. 4, 2026, 4:46 p.m.") sat next to the health page's tables in
ISO UTC with seconds (issue 31.6). Every time here is stored and shown in UTC (TIME_ZONE), so
the admin's lists, forms and history read the same as `worker_status` and the log.
"""

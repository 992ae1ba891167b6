"""Inbound email: the S3 / local-folder poller, MIME parsing, reply handling, quarantine, relay."""

#!/usr/bin/env python
"""Django's command-line utility for the worker project (project/cli.py: configuration errors
are one line each)."""

import os
import sys


def main() -> None:
    os.environ.setdefault("DJANGO_SETTINGS_MODULE", "project.settings")
    from project.cli import main as run

    sys.exit(run(sys.argv))


if __name__ == "__main__":
    main()

"""Run a shell command line in a pseudo-terminal and type answers, as a user at a prompt
does (createsuperuser asks only when it runs in a terminal)."""

from __future__ import annotations

import os
import pty
import select
import subprocess
import time


def run_in_terminal(
    command: str, answers: str, *, env: dict[str, str], timeout: float = 120
) -> str:
    """Run `command` with bash in a pty, send `answers` line by line as prompts appear; return
    everything it printed."""
    leader, follower = pty.openpty()
    process = subprocess.Popen(
        ["bash", "-c", command],
        stdin=follower,
        stdout=follower,
        stderr=follower,
        env=env,
        cwd="/",
        start_new_session=True,
    )
    os.close(follower)
    output = b""
    lines = answers.splitlines(keepends=True)
    answered_at = -1  # len(output) when the last answer was typed
    deadline = time.monotonic() + timeout
    try:
        while time.monotonic() < deadline:
            ready, _, _ = select.select([leader], [], [], 0.3)
            if ready:
                try:
                    chunk = os.read(leader, 4096)
                except OSError:  # the command ended and closed the terminal
                    break
                if not chunk:
                    break
                output += chunk
            elif process.poll() is not None:
                break
            elif lines and output.rstrip().endswith(b":") and answered_at != len(output):
                # A prompt, then silence: the program waits (a password prompt flushes what
                # was typed before it turned echo off, so never type ahead).
                os.write(leader, lines.pop(0).encode())
                answered_at = len(output)
    finally:
        if process.poll() is None:
            process.kill()
        process.wait(timeout=10)
        os.close(leader)
    return output.decode(errors="replace")

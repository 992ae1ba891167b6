"""Issue 37, point 4 (memory): a forked process keeps sharing its parent's heap.

A django-q2 worker is a fork of the cluster's process: its pages stay shared with the
parent's while nothing writes to them. Python's cyclic collector writes to the header of
every object it traverses, so a worker that allocates a lot (1,000 async tasks in flight)
ran full collections over everything it inherited and un-shared the parent's whole heap:
the qcluster's summed PSS went from 111 MB idle to 193 MB (1.74 x; RSS 1.03 x), measured by
bench/against_pgqueuer.py. Objects alive at a fork are frozen (gc.freeze) so the child's
collections leave them alone.
"""

from __future__ import annotations

import gc
import os

import pytest


@pytest.mark.skipif(not hasattr(os, "fork"), reason="fork only")
def test_a_forked_child_leaves_the_objects_it_inherited_to_its_parent():
    inherited = [[n] for n in range(1000)]  # objects the collector tracks, alive at the fork
    read, write = os.pipe()
    pid = os.fork()
    if pid == 0:  # the child: how many inherited objects its collections will skip
        os.close(read)
        os.write(write, str(gc.get_freeze_count()).encode())
        os._exit(0)
    os.close(write)
    try:
        frozen = int(os.read(read, 64).decode())
    finally:
        os.close(read)
        os.waitpid(pid, 0)
    assert frozen >= len(inherited), frozen

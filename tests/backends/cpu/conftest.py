"""Fixtures shared by the CPU backend's tests."""

import pytest

from lucid.backends.cpu import get_num_threads, set_adaptive_threads, set_num_threads, thread_stats


@pytest.fixture
def fixed_threads():
    """Thread counts set by a test hold (and split paths run) while other processes keep the
    machine busy: the adaptive policy is off for the test; it and the count come back after."""
    adaptive, threads = thread_stats()["adaptive"], get_num_threads()
    set_adaptive_threads(False)
    yield
    set_adaptive_threads(adaptive)
    set_num_threads(threads)

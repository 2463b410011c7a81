"""The pool that creates integration tests' topic prefixes ahead (tests/support/prefixes.py),
without a broker: what it hands out, and that a failure reaches the tests instead of hanging them."""

from __future__ import annotations

import pytest
from tests.support import prefixes
from tests.support.prefixes import PrefixPool


class Recording(PrefixPool):
    def __init__(self, fail: int = 0) -> None:
        self.created: list[str] = []
        self.fail = fail
        super().__init__("127.0.0.1:9", ahead=2)

    async def _create(self, prefixes: list[str]) -> None:
        if self.fail:
            self.fail -= 1
            raise OSError("broker paused")
        self.created.extend(prefixes)


def test_each_prefix_is_handed_out_once_and_only_after_its_topics_were_created() -> None:
    pool = Recording()
    try:
        taken = [pool.take() for _ in range(7)]
    finally:
        pool.close()
    assert len(set(taken)) == 7
    assert set(taken) <= set(pool.created)
    assert all(p.startswith("it-") for p in taken)


def test_a_failed_creation_is_retried_with_fresh_prefixes() -> None:
    pool = Recording(fail=prefixes.ATTEMPTS - 1)
    try:
        assert pool.take() in pool.created
    finally:
        pool.close()


def test_a_broker_that_keeps_failing_fails_every_test_that_takes_a_prefix() -> None:
    pool = Recording(fail=10**6)
    try:
        for _ in range(2):
            with pytest.raises(OSError, match="broker paused"):
                pool.take()
    finally:
        pool.close()
    assert not pool._thread.is_alive()

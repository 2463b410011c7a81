"""Fixtures for every test, and the two tiers (README, "Development").

- ``make test``: every test not marked ``system`` (lint, unit tests, the integration core on both
  brokers). A new test lands here unless it is marked.
- ``make test-system``: tests marked ``system`` (``@pytest.mark.system``, or ``pytestmark`` for a
  whole file): the long forms, soak, fuzz, restarts, benches, the browser, the simulator tables.
  ``slow``, the marker's older name, counts as ``system``.
"""

from __future__ import annotations

import asyncio
import inspect
import os
from collections.abc import AsyncIterator

import pytest

# pytest-xdist's workers start with COLUMNS=80 and LINES=24 in their environment whatever the
# controller had, and fleetloop sizes its tables by COLUMNS (fleetloop/term.py): a table test then
# saw cells cut that a run without xdist shows whole. Each worker gets the controller's values.
TERMINAL_ENV = ("COLUMNS", "LINES")


@pytest.hookimpl(optionalhook=True)
def pytest_configure_node(node: object) -> None:
    node.workerinput["terminal_env"] = {k: os.environ.get(k) for k in TERMINAL_ENV}  # type: ignore[attr-defined]


def pytest_configure(config: pytest.Config) -> None:
    sent = getattr(config, "workerinput", {}).get("terminal_env")
    for key, value in (sent or {}).items():
        if value is None:
            os.environ.pop(key, None)
        else:
            os.environ[key] = value


@pytest.hookimpl(tryfirst=True)  # before -m selects by marker
def pytest_collection_modifyitems(config: pytest.Config, items: list[pytest.Item]) -> None:
    for item in items:
        if item.get_closest_marker("slow") is not None:
            item.add_marker(pytest.mark.system)


@pytest.fixture(autouse=True)
def _no_leftover_asyncio_tasks(request: pytest.FixtureRequest) -> None:
    """Fail an async test that leaves asyncio tasks running (after kopf's fixture of the same idea).

    A task nobody awaits hides errors and leaks into the next test; the owner must cancel and await
    it. Sync tests run no event loop, so only coroutine tests are guarded.
    """
    if inspect.iscoroutinefunction(getattr(request.node, "function", None)):
        request.getfixturevalue("_asyncio_task_guard")


@pytest.fixture
async def _asyncio_task_guard() -> AsyncIterator[None]:
    before = asyncio.all_tasks()
    yield
    for _ in range(3):  # let tasks that are finishing (cancelled, closing) take their last steps
        await asyncio.sleep(0)
    leftover = asyncio.all_tasks() - before - {asyncio.current_task()}
    if not leftover:
        return
    for task in leftover:  # clean up, so the loop closes without "Task was destroyed" noise
        task.cancel()
    await asyncio.wait(leftover, timeout=5)
    names = ", ".join(sorted(repr(task.get_coro()) for task in leftover))
    pytest.fail(f"the test left {len(leftover)} asyncio task(s) running: {names}", pytrace=False)

"""metastore.tasks: the one spawn-and-keep-a-reference helper."""

import asyncio

from metastore.tasks import keep, spawn


async def test_spawn_holds_the_task_until_it_is_done() -> None:
    tasks: set[asyncio.Task[object]] = set()
    gate = asyncio.Event()

    async def work() -> int:
        await gate.wait()
        return 7

    task = spawn(tasks, work(), name="work")
    assert tasks == {task} and task.get_name() == "work"
    gate.set()
    assert await task == 7
    await asyncio.sleep(0)          # done callbacks run on the next loop turn
    assert tasks == set()


async def test_keep_holds_a_task_made_elsewhere() -> None:
    tasks: set[asyncio.Task[object]] = set()
    task = keep(tasks, asyncio.get_running_loop().create_task(asyncio.sleep(10)))
    assert task in tasks
    task.cancel()
    await asyncio.gather(task, return_exceptions=True)
    await asyncio.sleep(0)
    assert tasks == set()


class CountingSet(set[asyncio.Task[object]]):
    """Counts ``discard`` calls: one per done callback ``keep`` added."""

    discards = 0

    def discard(self, task: asyncio.Task[object]) -> None:
        self.discards += 1
        super().discard(task)


async def test_keeping_a_held_task_again_adds_no_second_callback() -> None:
    tasks = CountingSet()
    gate = asyncio.Event()
    task = asyncio.get_running_loop().create_task(gate.wait())
    for _ in range(100):                      # a write loop handed out again for each request
        assert keep(tasks, task) is task
    gate.set()
    await task
    await asyncio.sleep(0)
    assert tasks == set()
    assert tasks.discards == 1                # old code: 100

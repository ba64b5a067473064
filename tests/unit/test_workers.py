"""The shared workers of a client host (transport/workers.py): a node's lane runs its items in order and one at a
time on threads shared with other nodes, and work that waits does not hold the others up."""

from __future__ import annotations

import threading

from fedhop.transport.workers import DaemonPool, SerialWork
from tests.waiting import wait_until


def test_a_lane_runs_its_items_in_order_one_at_a_time_on_shared_threads() -> None:
    pool = DaemonPool(3, "t")
    seen: dict[str, list[int]] = {"a": [], "b": []}
    running = {"a": 0, "b": 0}
    overlap: list[str] = []
    lock = threading.Lock()

    def handler(node: str):
        def handle(i: int) -> None:
            with lock:
                running[node] += 1
                if running[node] > 1:
                    overlap.append(node)
            seen[node].append(i)
            with lock:
                running[node] -= 1
        return handle

    lanes = {n: SerialWork(pool, handler(n), f"{n}-tasks") for n in seen}
    for i in range(200):
        for lane in lanes.values():
            lane.put(i)
    assert all(lane.close(timeout=30) for lane in lanes.values())
    assert seen == {"a": list(range(200)), "b": list(range(200))}
    assert overlap == []
    assert pool.threads() <= 3
    lanes["a"].put(999)  # a closed lane takes nothing more
    assert seen["a"][-1] == 199
    pool.shutdown()


def test_a_failing_item_is_logged_and_the_lane_goes_on() -> None:
    pool = DaemonPool(1, "t")
    done: list[int] = []

    def handle(i: int) -> None:
        if i == 1:
            raise ValueError("boom")
        done.append(i)

    lane = SerialWork(pool, handle, "x-tasks")
    for i in range(3):
        lane.put(i)
    assert lane.close(timeout=30)
    assert done == [0, 2]
    pool.shutdown()


def test_work_that_waits_does_not_hold_up_the_pools_other_work() -> None:
    # emulated slow nodes wait out their compute time on the shared task threads: with a pool of one thread, ten
    # waiting nodes would otherwise take turns (and the emulated times would add up instead of overlapping)
    pool = DaemonPool(1, "t")
    go = threading.Event()
    waiting = []
    lock = threading.Lock()

    def wait() -> None:
        with pool.blocking():
            with lock:
                waiting.append(threading.current_thread().name)
            go.wait(30)

    futures = [pool.submit(wait) for _ in range(10)]
    try:
        wait_until(lambda: len(waiting) == 10, "every waiting item to run at once", timeout=30)
        assert pool.submit(lambda: 7).result(timeout=30) == 7  # and other work still runs meanwhile
    finally:
        go.set()
    for f in futures:
        f.result(timeout=30)
    assert pool.threads() <= 1 + 10 + 1
    pool.shutdown()


def test_a_pool_names_its_thread_after_the_node_it_works_for() -> None:
    pool = DaemonPool(2, "joins")
    assert pool.submit(lambda: threading.current_thread().name, name="client-7").result(timeout=30) == "client-7"
    assert pool.submit(lambda: threading.current_thread().name).result(timeout=30).startswith("joins-")
    pool.shutdown()

"""Packing: each workload pod's pod-deletion-cost = the GPU pods on its node (pure planner)."""

from __future__ import annotations

from dataclasses import replace

from gpu_queue_scaler.companion.packing import MAX_COST_WRITES, PackPod, pack, parse_cost


def pods(
    node: str, n: int, *, workload: str | None = "inference/llama", pool: str = "gpu"
) -> list[PackPod]:
    return [PackPod("inference", f"{node}-{i}", node, pool, workload, None) for i in range(n)]


def applied(found: list[PackPod]) -> list[PackPod]:
    """The pods after the changes landed."""
    costs = {(c.pod.namespace, c.pod.name): c.value for c in pack(found, 10_000)}
    return [
        replace(p, deletion_cost=costs.get((p.namespace, p.name), p.deletion_cost)) for p in found
    ]


def test_costs_are_the_pods_on_the_node_and_a_second_pass_changes_nothing() -> None:
    found = pods("full", 8) + pods("thin", 2)
    changes = pack(found)
    assert sorted((c.pod.node, c.cost) for c in changes) == [("full", 8)] * 8 + [("thin", 2)] * 2
    assert {c.value for c in changes} == {"8", "2"}
    assert all(c.change.startswith("deletion cost unset -> ") for c in changes)
    assert pack(applied(found)) == []


def test_other_apps_pods_count_but_are_never_written() -> None:
    found = [
        *pods("a", 2),
        PackPod("other", "x", "a", "gpu", None, None),
        PackPod("other", "y", "b", "gpu", None, None),
    ]
    changes = pack(found)
    assert [(c.pod.name, c.cost) for c in changes] == [("a-0", 3), ("a-1", 3)]


def test_only_the_pods_that_differ_are_returned() -> None:
    found = pods("n", 3)
    found[0] = replace(found[0], deletion_cost="3")  # right already
    found[1] = replace(found[1], deletion_cost="oops")  # unparsable: counts as 0, rewritten
    found[2] = replace(found[2], deletion_cost="7")  # stale
    assert [(c.pod.name, c.cost) for c in pack(found)] == [("n-2", 3), ("n-1", 3)]  # |4| > |3|
    assert (
        parse_cost("oops") is None and parse_cost(" 12 ") == 12 and parse_cost(str(2**31)) is None
    )


def test_the_bound_takes_the_largest_changes_first_deterministically() -> None:
    found = pods("n1", 8) + pods("n2", 8) + pods("n3", 1)
    for i in range(8):  # n2's pods already carry their cost
        found[8 + i] = replace(found[8 + i], deletion_cost="8")
    changes = pack(found, limit=5)
    assert [(c.pod.node, c.pod.name) for c in changes] == [("n1", f"n1-{i}") for i in range(5)]
    assert pack(list(reversed(found)), limit=5) == changes  # the input order does not matter
    assert pack(found, limit=0) == []
    # A big cluster: never more than the bound per pass, and it converges pass by pass.
    big = [p for n in range(40) for p in pods(f"node-{n:02d}", 8)]
    passes = 0
    while changes := pack(big):
        assert len(changes) <= MAX_COST_WRITES == 100
        done = {(c.pod.namespace, c.pod.name): c.value for c in changes}
        big = [
            replace(p, deletion_cost=done.get((p.namespace, p.name), p.deletion_cost)) for p in big
        ]
        passes += 1
    assert passes == 4  # 320 pods, 100 per pass


def test_pools_are_told_apart_by_node() -> None:
    found = pods("n", 2, pool="a") + pods("m", 1, pool="b")
    assert sorted((c.pod.nodepool, c.cost) for c in pack(found)) == [("a", 2), ("a", 2), ("b", 1)]

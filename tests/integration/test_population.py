"""A population shared by a cluster's nodes (cluster_population.py, in its own process):
each node's hosts hold their own clients, made there, evenly split, and the results are
those of the same run in one process."""

from __future__ import annotations

import json
import subprocess
import sys
from collections import Counter

import pytest

from tests.integration.cluster_population import CLIENTS, PER_HOST

pytestmark = pytest.mark.cluster


def test_the_population_is_shared_evenly_by_the_nodes(tmp_path):
    done = subprocess.run(
        [sys.executable, "-m", "tests.integration.cluster_population", str(tmp_path)],
        capture_output=True,
        text=True,
        timeout=600,
    )
    assert done.returncode == 0, done.stderr[-3000:]
    (line,) = [x for x in done.stdout.splitlines() if x.startswith("POPULATION ")]
    result = json.loads(line.removeprefix("POPULATION "))
    nodes = result["nodes"]
    assert len(nodes) == CLIENTS // PER_HOST  # 4 client hosts of 500
    # host clients-k holds clients 500k .. 500k + 499
    clients_per_node = Counter({node: 0 for node in nodes.values()})
    for node in nodes.values():
        clients_per_node[node] += PER_HOST
    assert set(clients_per_node) == {result["head"], result["worker"]}
    assert sorted(clients_per_node.values()) == [CLIENTS // 2, CLIENTS // 2]
    assert result["equal"]  # the same numbers as one process

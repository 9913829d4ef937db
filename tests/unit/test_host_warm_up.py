"""A host pays torch's one-time costs while it starts: its first round imports nothing.

torch imports torch._dynamo (2-2.5 s on 2 cores) on the first use of FlopCounterMode, of an
optimiser or of `Module.state_dict`; a server's first broadcast once paid it inside round 1.
Each host is built alone in a fresh process, as a Ray actor is, so nothing another host
imported hides what this one would import.
"""

from __future__ import annotations

import json
import subprocess
import sys

import pytest

from tests.conftest import digits_experiment

# Builds one host of the experiment (argv[1]) alone, runs its role's step of round 1 and
# prints the modules imported during that step.
ROUND_ONE = """
import json, sys
from raymtl.algorithms.base import Phase
from raymtl.algorithms.training import model_tensors
from raymtl.config import parse_config
from raymtl.runtime.executors.executor import InlineExecutor
from raymtl.runtime.hosts.host import ParticipantHost
from raymtl.runtime.executors.layout import lay_out
from raymtl.runtime.executors.planning import plan_seed
from raymtl.runtime.router import Envelope

cfg = parse_config(json.loads(sys.argv[1]))
specs = lay_out(plan_seed(cfg, 0), InlineExecutor(cfg.runtime), cfg.output.dir)
host = ParticipantHost(specs[sys.argv[2]])
host.build()
participants = host.spec.participants
sampled = tuple(range(cfg.data.num_clients))
if sys.argv[2] == "server":
    phase, inboxes = Phase("server", "broadcast", "all"), {"server": []}
else:  # the server's broadcast, made here before the step
    server = host.algorithm.init_state("server", None, host.spec.federation)
    payload = host.put(model_tensors(server.model))
    phase = Phase("client", "train", "sampled", trains=True)
    inboxes = {p: [Envelope("server", p, "global_model", 0, payload)] for p in participants}
before = set(sys.modules)
result = host.run_phase(1, phase, inboxes, sampled)
assert result.envelopes, "the step sent nothing"
print(json.dumps(sorted(set(sys.modules) - before)))
"""


@pytest.mark.slow
@pytest.mark.parametrize("host", ["server", "clients-0"])
def test_a_hosts_first_round_imports_nothing(tmp_path, host):
    experiment = digits_experiment(tmp_path, **{"data.num_clients": 3})
    done = subprocess.run(
        [sys.executable, "-c", ROUND_ONE, json.dumps(experiment), host],
        capture_output=True,
        text=True,
        check=False,
        timeout=300,
    )
    assert done.returncode == 0, done.stderr[-3000:]
    imported = json.loads(done.stdout.strip().splitlines()[-1])
    assert imported == [], f"{host}'s round 1 imported {imported[:10]}"

"""Where hosts run and how they are laid out: the `Executor` contract (start hosts, call them,
shut them down) and its inline and Ray implementations; beside it, which host holds which
participants (membership.py), where hosts go and the arithmetic of CPUs and GPUs per node
(placement.py), what their machines have (probes.py), the peer graph (topology.py); the
`Plan` of a seed's federation and every check before an actor starts (planning.py); and
starting or joining Ray (launch.py)."""

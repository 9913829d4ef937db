"""Where hosts run and how they are laid out: the `Executor` contract and its inline and Ray
implementations, the plan of a seed's federation (partition, topology, host layout and every
check before an actor starts), the arithmetic of CPUs and GPUs per node, and starting or
joining Ray."""

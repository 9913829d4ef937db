"""The run itself: a seed's live `Federation` (start, rounds, checkpoints, recovery), the round
loop (phases, evaluation, the bit accounting, sampling), every seed of an experiment
(`Driver`, `run_experiment`), and the events its callbacks see."""

"""The user's API: `run`, `resume`, `load_results` and `Results`; `compare` and `Comparison`;
`tune` and `Sweep`; `Federation` (one seed, round by round); `Callback` and `RoundEvent`;
`MLflowCallback`. Every experiment enters through `experiments` (paths, mappings, configs,
`arms:` files, overrides). `import raymtl` reaches all of them lazily (raymtl/__init__.py).
"""

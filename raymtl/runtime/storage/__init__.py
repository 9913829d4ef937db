"""Where a run lives: paths and URIs (`location`), run folders (`run_dirs`) and checkpoints
with their manifests (`checkpoints`)."""

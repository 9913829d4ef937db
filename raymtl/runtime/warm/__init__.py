"""`raymtl up` / `raymtl down`: a service that keeps a local Ray, warm host actors and a
preloaded process between commands. Importing this package imports nothing else: the
console script calls `preload.forward` before anything heavy."""

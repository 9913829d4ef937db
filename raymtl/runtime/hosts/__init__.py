"""What runs inside a host (in process, or in a Ray actor): `ParticipantHost` and its
clients' data, kept state, working models, compute settings and memory accounting."""

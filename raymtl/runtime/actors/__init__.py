"""The Ray actors that carry hosts (their classes and how one is started), and the pool that
keeps idle ones between the federations of one driver."""

"""The CPU tensor-parallel inference core: NUMA-local weight shards, shared-memory all-reduce.

Imported lazily by engine processes after they pin themselves: numpy or torch must not be
loaded before that.
"""

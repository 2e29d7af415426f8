"""Engine processes: one per instance (accelerator or NUMA-pinned CPU), launched, fed and
watched by the dispatcher.

Imported lazily: a worker imports this package before it pins itself, and numpy or torch
must not be loaded before that.
"""

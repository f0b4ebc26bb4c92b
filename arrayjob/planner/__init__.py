"""The planner: pure functions from shapes, dtypes and chunk metadata to a physical plan.

No I/O and no Ray here: ``estimate`` and ``plan`` never read data.
"""

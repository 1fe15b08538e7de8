"""Live control of the placement: the slider, the memory budgets, calibration, and migration.

controller.py (the placement controller: plans, re-plans on a slider move or a budget change, runs
the migration at the engine thread's safe points), migrator.py (expert forms built off the decode
thread and swapped in with a bounded stall), profiling.py (the model's and the machine's measures a
plan needs, taken on first start and cached), context_fit.py (the context a model opens at, against
the memory free).

May import: measures, planning and everything below them. Imported by runtime (the session owns a controller).
"""

"""What the planner is given, measured: this machine's cost of each tier (hardware.py, measured once and
cached), a model's sensitivity and popularity per expert (profile.py: the calibration), the planner's
inputs made of the two or of a config or GGUF header alone (inputs.py), and whether a model fits this
machine (fit.py: the model browser and `mixdesk plan`).

May import: planning, model and everything below it.
"""

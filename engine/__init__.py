"""Mixdesk engine: a headless library that runs Mixture-of-Experts models with per-expert placement.

Never imports Qt. The GUI (app/) and the CLI reach it through its public functions and, later,
the session's commands and events.
"""

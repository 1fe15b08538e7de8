"""Mixdesk engine: a headless library that runs Mixture-of-Experts models with per-expert placement.

Its folders are layers; each imports only the layers below it (pyproject's [tool.importlinter]
contracts, checked by `lint-imports` in the default test run), from the top:

    tools/                  the command line and the local server
    runtime/                the engine thread: session, scheduler, generation, load, queries
    control/                live placement: the controller, migration, first-start profiling, context fit
    measures/               this machine's and this model's measures, made into the planner's inputs
    model/ | sources/       the forward (MoE blocks, dense layers) | the demo, the Hub, test models
    kv/ | experts/          keys and values | one expert in one tier: forms, builds, costs
    files/                  checkpoints: safetensors, GGUF, config.json, mappings
    layers/ | families/ | prompts/      a layer's parts | each family's adapter | templates, reply formats
    planning/               the planner: pure numpy over the measured inputs
    machine/ | placement/ | native/     devices, memory | the Tier and Placement values | C kernels
    protocol/               the commands, events and errors every client speaks (no torch)

Never imports Qt or app/: the window and the CLI reach the engine through protocol/'s commands and
events (runtime/session.py).
"""

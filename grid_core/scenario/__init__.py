"""The deterministic scenario lab: a logical heterogeneous fleet driven by production code.

See ``docs/scenario-lab.md``. Entry points: :func:`grid_core.scenario.run.run_scenario` and
:func:`grid_core.scenario.graduate.graduate`.
"""

"""Portfolio planning for unbound (``auto``) demand: the contract and the controller's pass.

Specification, "Proactive observation and portfolio planning". A plugin answering
``grid_search_portfolio`` receives a :class:`PortfolioSnapshot` and a
:class:`PortfolioContext` and returns a :class:`PortfolioDecision`; the built-in answer is the
``grid_portfolio`` plugin (``plugins/grid_portfolio``). Plugins import the contract from
:mod:`grid_core.api`, the core from ``grid_core.portfolio.types``. Submodules: ``types`` (the
contract), ``feasibility`` (the hard-rule scan), ``evidence`` (the outcome book),
``candidates`` (utility), ``gate`` (the admission gate), ``project`` (demand that never
evicts) and ``run`` (one tick's pass and the status rows).
"""

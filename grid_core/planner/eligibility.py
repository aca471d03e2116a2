"""Host eligibility rules, as the planner's modules import them (defined in
:mod:`grid_core.eligibility`, below both the planner and the demand side)."""

from grid_core.eligibility import MEMORY_STATES as MEMORY_STATES
from grid_core.eligibility import NEW_WORK_STATES as NEW_WORK_STATES
from grid_core.eligibility import SERVING_STATES as SERVING_STATES
from grid_core.eligibility import host_ineligible_reason as host_ineligible_reason
from grid_core.eligibility import host_signature as host_signature
from grid_core.eligibility import incompatibility as incompatibility
from grid_core.eligibility import outlasts_protection as outlasts_protection
from grid_core.eligibility import placement_incompatibility as placement_incompatibility
from grid_core.eligibility import runtime_for as runtime_for

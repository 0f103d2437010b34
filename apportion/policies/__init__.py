"""Every scheduling policy behind one seam, by one name: apportion's formulations (a
recipe each) and every baseline, with the registry, the scheduler every driver holds and
the library's round entry point.

``make_policy(name, config)`` builds one; ``POLICIES`` names them (``policy_names()``
with plug-ins); ``Scheduler(config, store, apply)`` builds the policy a config names once
and runs each round through the pipeline (:mod:`apportion.round`) with the store's commit
and the driver's apply hook; ``run_round(cluster, jobs, now, RoundConfig(...))`` is one
such round; ``register`` and ``register_formulation`` add a policy or a formulation.
"""

from apportion.policies.config import BACKENDS, GAVEL_POLICIES, RoundConfig, check_mip_gap
from apportion.policies.formulation import FormulationPolicy, Optimising
from apportion.policies.recipes import RECIPES, Recipe
from apportion.policies.registry import (POLICIES, Policy, load_plugins, make_policy,
                                         objective_policies, objective_preset_options,
                                         policy_names, quota_options, register,
                                         with_objective_preset,
                                         register_formulation)
from apportion.policies.rounds import (check_round_flags, checked_config, estimator_from,
                                       run_round)
from apportion.policies.scheduler import Scheduler, formulation_names, policy_for

__all__ = ["BACKENDS", "FormulationPolicy", "GAVEL_POLICIES", "Optimising", "POLICIES",
           "Policy", "RECIPES", "Recipe", "RoundConfig", "check_mip_gap", "check_round_flags",
           "checked_config", "estimator_from", "formulation_names", "load_plugins",
           "make_policy", "objective_policies", "objective_preset_options", "policy_for",
           "policy_names", "quota_options", "register", "with_objective_preset",
           "register_formulation", "run_round", "Scheduler"]

"""The launcher-population controller: keeps the launcher Pods that LauncherPopulationPolicies ask for."""

from controller.populator.populator import Populator, PopulatorOptions, run_populator

__all__ = ["Populator", "PopulatorOptions", "run_populator"]

"""Ember: energy-frugal on-device training for open-toolchain FPGAs (host package)."""

__version__ = "0.1.0"

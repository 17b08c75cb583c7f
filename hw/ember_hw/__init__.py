"""Ember's gateware, in Amaranth 0.5. Every width and counter comes from ember.spec."""

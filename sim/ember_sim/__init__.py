"""Simulation harnesses: cocotb benches and the simulated board."""

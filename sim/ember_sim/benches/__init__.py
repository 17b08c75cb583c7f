"""cocotb benches (run inside the simulator by ember_sim.rtl.run) and the small designs they need."""

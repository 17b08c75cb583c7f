"""cocotb bench of ``WeightMemory`` (ember_hw.weights), run by tests/test_weight_memory.py.

The bench only plays a list of cycles and records what the memory answers; the test generates
the cycles and checks the answers against its Python model, the same way for the Amaranth
simulator (portable path) and for Icarus with Yosys's SB_SPRAM256KA model (SPRAM path).

Case keys (``rtl.run(case=...)``): ``ops``, one entry per cycle
``[rd_en, rd_addr, wr_en, wr_addr, wr_data]`` (``wr_en`` the lane mask, ``wr_data`` the whole
word). Result: ``data``, per cycle the binary string of ``rd.data`` one cycle later (``None``
for cycles without ``rd_en``; X or Z bits appear as such), and ``conflict`` after the ops.

``conflict_sets_sticky`` then reads and writes in one cycle and records ``conflict`` after
it and two idle cycles later (``conflict_after``).
"""

import cocotb
from cocotb.triggers import FallingEdge

from ember_sim import clock, rtl


def _drive(dut, rd_en, rd_addr, wr_en, wr_addr, wr_data):
    dut.rd__en.value = rd_en
    dut.rd__addr.value = rd_addr
    dut.wr__en.value = wr_en
    dut.wr__addr.value = wr_addr
    dut.wr__data.value = wr_data


async def _start(dut):
    clk = clock.start_clock(dut)
    _drive(dut, 0, 0, 0, 0, 0)
    await clock.reset(dut, clk)
    # inputs change at falling edges, outputs are sampled there (settled since the rising edge)
    await FallingEdge(dut.clk)


@cocotb.test()
async def play_ops(dut):
    ops = rtl.load_case()["ops"]
    await _start(dut)
    data = []
    for op in ops:
        _drive(dut, *op)
        await FallingEdge(dut.clk)         # the rising edge took op; rd.data answers it
        data.append(str(dut.rd__data.value) if op[0] else None)
    _drive(dut, 0, 0, 0, 0, 0)
    await FallingEdge(dut.clk)
    rtl.write_result({"data": data, "conflict": int(dut.conflict.value)})


@cocotb.test()
async def conflict_sets_sticky(dut):
    await _start(dut)
    before = int(dut.conflict.value)
    _drive(dut, 1, 0, 1, 1, 0)
    await FallingEdge(dut.clk)
    _drive(dut, 0, 0, 0, 0, 0)
    await FallingEdge(dut.clk)
    await FallingEdge(dut.clk)
    rtl.write_result({"conflict_before": before, "conflict_after": int(dut.conflict.value)})

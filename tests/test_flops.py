"""ember_boards.flops: which flip-flops of an iCE40 netlist take a logic cell of their own.
A hand-made netlist with one flip-flop of each cause, and a small design through the real
Yosys (YoWASP, synth_ice40) whose registers' causes are known from its source."""

import json
import os
import subprocess

from amaranth.back import rtlil
from amaranth.hdl import Module, Signal
from amaranth.lib import wiring
from amaranth.lib.wiring import In, Out

from ember_boards import flops
from ember_boards.build import _yowasp_environment


def _cell(kind, **ports):
    directions = {p: ("output" if p in ("O", "Q", "RDATA", "CO") else "input") for p in ports}
    return {"type": kind, "connections": {p: list(b) for p, b in ports.items()},
            "port_directions": directions}


def _netlist(cells, netnames, ports=None):
    return {"modules": {"top": {"attributes": {"top": "1"}, "ports": ports or {},
                                "cells": cells, "netnames": netnames}}}


def test_each_cause_from_a_hand_made_netlist():
    cells = {
        "lut_alone": _cell("SB_LUT4", I0=[2], O=[10]),
        "ff_packs": _cell("SB_DFF", D=[10], Q=[11], C=[1]),
        "lut_shared": _cell("SB_LUT4", I0=[2], O=[20]),
        "ff_shared_a": _cell("SB_DFF", D=[20], Q=[21], C=[1]),
        "ff_shared_b": _cell("SB_DFFE", D=[20], Q=[22], C=[1], E=[2]),
        "ff_copy": _cell("SB_DFF", D=[11], Q=[30], C=[1]),
        "ram": _cell("SB_RAM40_4K", RDATA=[40]),
        "ff_ram": _cell("SB_DFF", D=[40], Q=[41], C=[1]),
        "ff_port": _cell("SB_DFFSR", D=[2], Q=[50], C=[1], R=["0"]),
        # a LUT driving a flip-flop and an output port does not pack either
        "lut_port": _cell("SB_LUT4", I0=[2], O=[60]),
        "ff_lut_port": _cell("SB_DFF", D=[60], Q=[61], C=[1]),
    }
    names = {"u.acc": {"bits": [11, 30], "hide_name": 0},
             "$auto$q": {"bits": [11], "hide_name": 1},
             "v.state": {"bits": [21, 22, 41, 50, 61], "hide_name": 0}}
    ports = {"o": {"direction": "output", "bits": [60]}, "i": {"direction": "input", "bits": [2]}}
    got = sorted(flops.classify(_netlist(cells, names, ports)))
    assert got == sorted([("lut", "u.acc"), ("flop", "u.acc"), ("shared_lut", "v.state"),
                          ("shared_lut", "v.state"), ("ram", "v.state"), ("other", "v.state"),
                          ("shared_lut", "v.state")])
    s = flops.summarize(got, top=1, depth=1)
    assert s["flip_flops"] == 7 and s["own_cell"] == 6
    assert s["by_cause"] == {"lut": 1, "shared_lut": 3, "flop": 1, "ram": 1, "other": 1}
    assert s["own_cell_by_scope"] == {"v": {"shared_lut": 3, "ram": 1, "other": 1},
                                      "u": {"flop": 1}}
    assert s["own_cell_registers"] == {"v.state": 5}


class _Registers(wiring.Component):
    """Four registers of known cause: ``fresh`` from a LUT of its own, ``copy`` of
    ``fresh``, ``left`` and ``right`` (held while ``hold``, so that Yosys does not merge
    the two) of one LUT (x) that also drives an output."""
    a: In(4)
    b: In(4)
    hold: In(1)
    o: Out(4)
    p: Out(8)

    def elaborate(self, platform):
        m = Module()
        fresh, copy = Signal(4), Signal(4)
        left, right = Signal(4), Signal(4)
        x = Signal(4)
        m.d.comb += x.eq(self.a ^ self.b)
        m.d.sync += [fresh.eq(self.a & ~self.b), copy.eq(fresh), left.eq(x)]
        with m.If(~self.hold):
            m.d.sync += right.eq(x)
        m.d.comb += [self.o.eq(x), self.p.eq(copy ^ left ^ right)]
        return m


def test_a_synthesized_design(tmp_path, monkeypatch):
    monkeypatch.chdir(tmp_path)
    _yowasp_environment()
    (tmp_path / "top.il").write_text(rtlil.convert(_Registers(), name="top"))
    subprocess.run([os.environ["YOSYS"], "-q", "-p",
                    "read_rtlil top.il; synth_ice40 -top top; write_json top.json"],
                   check=True, capture_output=True)
    got = flops.summarize(flops.classify(json.loads((tmp_path / "top.json").read_text())))
    assert got["flip_flops"] == 16
    assert got["by_cause"] == {"lut": 4, "shared_lut": 8, "flop": 4, "ram": 0, "other": 0}
    assert got["own_cell"] == 12
    assert flops.main([str(tmp_path / "top.json"), "--json", str(tmp_path / "s.json")]) == 0
    assert json.loads((tmp_path / "s.json").read_text()) == got

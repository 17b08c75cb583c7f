"""Which flip-flops of an iCE40 netlist take a logic cell of their own, and why.

    python -m ember_boards.flops build/icebreaker/top.json [--top N] [--depth D] [--json F]

An iCE40 logic cell holds one LUT4 and one flip-flop. nextpnr packs a flip-flop into its
LUT's cell only when that LUT's output drives nothing but the flip-flop's D input; every
other flip-flop gets a cell whose LUT passes D through (nextpnr's "DFF only" cells). On a
full UP5K those cells are what is left to win, so this tool reads the synthesized netlist a
board build leaves (``<out>/top.json``, Yosys's ``write_json`` of the flattened design) and
sorts every SB_DFF* by what drives its D:

- ``lut``: a LUT4 that drives only this flip-flop: packed, no cell of its own;
- ``shared_lut``: a LUT4 whose output goes elsewhere too;
- ``flop``: another flip-flop's Q (a register copied into a register, as a pipeline or a
  held setting does);
- ``ram``: a block RAM's, SPRAM's or DSP's output (SB_RAM40_4K, SB_SPRAM256KA, SB_MAC16);
- ``other``: a carry, a constant, an I/O, a PLL or a top port.

Everything but ``lut`` is a cell of its own. It prints the counts by cause, by hierarchy
(the first ``--depth`` parts of the register's name) and the ``--top`` registers with the
most such flip-flops; ``--json`` writes them as one object. docs/boards.md quotes it.
"""

import argparse
import json
import re
import sys
from collections import Counter, defaultdict

#: The causes, in the order they are printed; only "lut" packs.
CAUSES = ("lut", "shared_lut", "flop", "ram", "other")
#: Cell types whose outputs count as "ram".
RAM_CELLS = ("SB_RAM40_4K", "SB_SPRAM256KA", "SB_MAC16")
#: A register name's bit index: "core.acc[3]" -> "core.acc".
_BIT = re.compile(r"\[\d+\]$")


def _top_module(netlist):
    modules = netlist["modules"]
    tops = [n for n, m in modules.items() if int(m.get("attributes", {}).get("top", "0"), 2)]
    if len(tops) != 1:
        raise ValueError(f"the netlist has {len(tops)} top modules ({', '.join(tops)}); "
                         f"expected the one flattened design a board build writes")
    return modules[tops[0]]


def _bit_names(module):
    """Each net bit's most readable name: a name the designer gave over Yosys's own ($...)."""
    names = {}
    for name, net in module["netnames"].items():
        rank = (net.get("hide_name", 0), name.startswith("$"), len(name))
        for i, bit in enumerate(net["bits"]):
            if isinstance(bit, str):
                continue
            label = name if len(net["bits"]) == 1 else f"{name}[{i}]"
            if bit not in names or rank < names[bit][0]:
                names[bit] = (rank, label)
    return {bit: label for bit, (_, label) in names.items()}


def classify(netlist):
    """Every flip-flop of the netlist's top module: a list of (cause, register name)."""
    module = _top_module(netlist)
    cells = module["cells"]
    drivers, sinks = {}, Counter()
    for name, cell in cells.items():
        for port, bits in cell["connections"].items():
            direction = cell.get("port_directions", {}).get(port, "input")
            for bit in bits:
                if isinstance(bit, str):
                    continue
                if direction == "output":
                    drivers[bit] = cell["type"]
                else:
                    sinks[bit] += 1
    # a top output port is a sink too: a LUT driving one and a flip-flop does not pack
    for port in module.get("ports", {}).values():
        if port["direction"] == "output":
            for bit in port["bits"]:
                if not isinstance(bit, str):
                    sinks[bit] += 1
    names = _bit_names(module)
    out = []
    for cell in cells.values():
        if not cell["type"].startswith("SB_DFF"):
            continue
        (d,), (q,) = cell["connections"]["D"], cell["connections"]["Q"]
        driver = drivers.get(d) if not isinstance(d, str) else None
        if driver == "SB_LUT4":
            cause = "lut" if sinks[d] == 1 else "shared_lut"
        elif driver is not None and driver.startswith("SB_DFF"):
            cause = "flop"
        elif driver in RAM_CELLS:
            cause = "ram"
        else:
            cause = "other"
        out.append((cause, _BIT.sub("", names.get(q, "?"))))
    return out


def summarize(flops, top=15, depth=2):
    """The counts: flip-flops in all, by cause; the unpacked ones by hierarchy (the first
    `depth` dot-separated parts of the name) and cause, and the `top` registers with most."""
    by_cause = Counter(cause for cause, _ in flops)
    alone = [(cause, name) for cause, name in flops if cause != "lut"]
    by_scope = defaultdict(Counter)
    for cause, name in alone:
        by_scope[".".join(name.split(".")[:depth])][cause] += 1
    by_register = Counter(name for _, name in alone)
    return {
        "flip_flops": len(flops),
        "own_cell": len(alone),
        "by_cause": {c: by_cause[c] for c in CAUSES},
        "own_cell_by_scope": {s: dict(c) for s, c in
                              sorted(by_scope.items(), key=lambda kv: -sum(kv[1].values()))},
        "own_cell_registers": dict(by_register.most_common(top)),
    }


def main(argv=None):
    ap = argparse.ArgumentParser(prog="python -m ember_boards.flops", description=__doc__,
                                 formatter_class=argparse.RawDescriptionHelpFormatter)
    ap.add_argument("netlist", help="a board build's top.json (Yosys write_json)")
    ap.add_argument("--top", type=int, default=15, help="registers to list (default 15)")
    ap.add_argument("--depth", type=int, default=2, help="name parts of a scope (default 2)")
    ap.add_argument("--json", help="write the summary to this file")
    args = ap.parse_args(argv)
    try:
        with open(args.netlist) as f:
            netlist = json.load(f)
        s = summarize(classify(netlist), args.top, args.depth)
    except (OSError, ValueError, KeyError) as e:
        print(f"flops: {args.netlist}: {e}", file=sys.stderr)
        return 1
    print(f"{s['flip_flops']} flip-flops, {s['own_cell']} in a logic cell of their own")
    print("by what drives D: " + ", ".join(f"{c} {n}" for c, n in s["by_cause"].items()))
    print("own cells by scope:")
    for scope, causes in s["own_cell_by_scope"].items():
        detail = ", ".join(f"{c} {n}" for c, n in causes.items())
        print(f"  {sum(causes.values()):6d}  {scope}  ({detail})")
    print("registers with the most:")
    for name, n in s["own_cell_registers"].items():
        print(f"  {n:6d}  {name}")
    if args.json:
        with open(args.json, "w") as f:
            json.dump(s, f, indent=2)
            f.write("\n")
    return 0


if __name__ == "__main__":
    sys.exit(main())

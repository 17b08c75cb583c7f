"""The sequencer's states per build: an optional unit's states (engine.UNIT_STATES) exist
exactly when the build has the unit, and a state name the phases ask for that the build does
not know is an error, not silently dropped (_Sequencer.present)."""

import dataclasses
import gc
import warnings

import pytest
from amaranth.hdl import Fragment, UnusedElaboratable

from ember import spec
from ember_hw import engine
from ember_hw.engine import UNIT_STATES, EngineCore

SMALL = spec.BUILDS["tiny"]


def states_of(build):
    core = EngineCore(build)
    Fragment.get(core, None)
    return set(core.states)


def test_unit_states_exist_exactly_with_their_unit():
    full = states_of(SMALL)
    every_unit = {st for names in UNIT_STATES.values() for st in names}
    assert every_unit <= full
    for unit in UNIT_STATES:
        # leaving ssprop out also leaves out ssprop_random, which needs it (spec.Build)
        gone = {unit, "ssprop_random"} if unit == "ssprop" else {unit}
        kept = tuple(f for f in SMALL.features if f not in gone)
        lean = dataclasses.replace(SMALL, name=f"no_{unit}", features=kept)
        left = {st for u, names in UNIT_STATES.items() if u not in kept for st in names}
        assert states_of(lean) == full - left, unit


def test_a_misspelled_state_is_an_error(monkeypatch):
    original = engine._Sequencer.present

    def misspelled(self, *states):
        return original(self, *states, "WG_FULLL")

    monkeypatch.setattr(engine._Sequencer, "present", misspelled)
    with warnings.catch_warnings():
        warnings.simplefilter("ignore", UnusedElaboratable)
        with pytest.raises(ValueError, match="WG_FULLL"):
            Fragment.get(EngineCore(SMALL), None)
        gc.collect()        # the half-built units go now, their warning ignored

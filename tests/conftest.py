import numpy as np
import pytest

from ember import data, golden, spec


@pytest.fixture(scope="session")
def digits():
    return data.load_digits()


def make_model(layers, seed=0, build=spec.DEFAULT_BUILD):
    m = golden.GoldenModel(build)
    m.configure(layers)
    m.load_weights(golden.init_weights(layers, seed))
    return m


def random_batch(rng, layers, batch, zero_fraction=0.5):
    x = rng.integers(1, 256, size=(batch, layers[0]))
    x[rng.random(x.shape) < zero_fraction] = 0
    y = rng.integers(0, layers[-1], size=batch)
    return x, y

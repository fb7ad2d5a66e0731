"""Run:AI's AIkit's documented Keras usage, run with only the imports changed.

The scripts are Run:AI's own examples, verbatim (tests/runai_originals), migrated by
tests/runai_migration.py (``runai.ga.keras`` -> ``aikit.ga.TF``, ``runai.elastic.keras`` ->
``aikit.elastic.TF``); besides, MNIST's sizes hard-coded in two reshapes and Keras 3's rename of
``lr`` are changed. The first 300 training digits stand in for MNIST's 60,000.
"""

from __future__ import annotations

import random

import pytest
import runai_migration
from tf_common import keras

import aikit.elastic
import aikit.ga.TF

SAMPLES = 300
pytestmark = [pytest.mark.slow,  # trains (about 10 s of CPU each)
              pytest.mark.filterwarnings("ignore:Do not pass an `input_shape`")]  # the original's Keras 2 model


def run_example(monkeypatch, name: str, keras_3: list, prebuilt: bool = True) -> dict:
    runai_migration.install_stand_ins(monkeypatch, SAMPLES)
    # the GA example picks the wrapper or the prebuilt optimizer at random (random.choice([True, False]))
    monkeypatch.setattr(random, "choice", lambda options: options[1] if prebuilt else options[0])
    keras.utils.set_random_seed(0)
    return runai_migration.run(name, keras_3)


def test_ga_example_trains_with_either_form_identically(monkeypatch):
    """examples/ga/keras/mlp.py: ``Optimizer(keras.optimizers.Adam(), STEPS)`` and the prebuilt
    ``Adam(STEPS)``, fit on micro-batches of BATCH_SIZE // STEPS = 2: one update per 5 of them."""
    wrapped = run_example(monkeypatch, "ga_keras_mlp.py", runai_migration.DIGITS_SIZES, prebuilt=False)
    prebuilt = run_example(monkeypatch, "ga_keras_mlp.py", runai_migration.DIGITS_SIZES, prebuilt=True)
    assert type(wrapped["optimizer"]) is aikit.ga.TF.optimizers.Optimizer
    assert type(prebuilt["optimizer"]) is aikit.ga.TF.optimizers.Adam
    for run in (wrapped, prebuilt):
        assert int(run["optimizer"].iterations) == SAMPLES // 2 // 5
        assert int(run["optimizer"].micro_steps) == SAMPLES // 2
    assert wrapped["score"] == prebuilt["score"]  # same seed, same arithmetic
    assert prebuilt["score"][1] > 0.5  # held-out accuracy after 30 updates (chance: 0.1)


def test_elastic_example_plans_ga_and_publishes_runai_attributes(monkeypatch):
    """examples/elastic/keras/mnist.py: ``runai.elastic.keras.init(global_batch_size=128,
    max_gpu_batch_size=16)``, ``models.Model(model)``, ``batch_size=runai.elastic.batch_size``."""
    run = run_example(monkeypatch, "elastic_keras_mnist.py",
                      runai_migration.DIGITS_SIZES + runai_migration.KERAS_3_LR)
    assert (aikit.elastic.steps, aikit.elastic.batch_size, aikit.elastic.global_batch_size) == (8, 16, 128)
    assert (aikit.elastic.gpus, aikit.elastic.master) == (1, True)
    optimizer = run["model"].optimizer
    assert isinstance(optimizer, aikit.ga.TF.optimizers.Optimizer) and optimizer.steps == 8
    assert type(optimizer.optimizer) is keras.optimizers.Adadelta and float(optimizer.learning_rate) == 1.0
    micro_steps = -(-SAMPLES // 16)  # the last, smaller micro-batch counts as one
    assert int(optimizer.micro_steps) == micro_steps and int(optimizer.iterations) == micro_steps // 8
    assert len(run["score"]) == 2

"""Issue 13's bad inputs to the Keras adapters: TF.init with a huge batch or a strategy given by
name, and the Keras LR finder's empty data and empty model; issue 29's: more devices than exist,
GA steps beyond int64, no gradient at all, x and y of different lengths, a history written to a
folder."""

from __future__ import annotations

import numpy as np
import pytest
import tensorflow as tf
from tf_common import keras, mlp

import aikit.elastic.TF as elastic_tf
from aikit.core.errors import InvalidType, InvalidValue
from aikit.ga.TF.optimizers import Optimizer
from aikit.lr_finder.TF import LRFinder


def test_init_with_a_huge_batch_is_a_plan_not_a_memory_error():
    plan = elastic_tf.init(10**18, 64, verbose=False)
    assert (plan.steps, plan.batch_size, plan.gpus) == (10**18 // 64, 64, 1)
    with pytest.raises(InvalidValue, match=r"global_batch_size 10{30} needs 15625000000000000000000000000 GA steps of "
                       r"at most 64 samples, more than the 9223372036854775807 Keras' step counter"):
        elastic_tf.init(10**30, 64, verbose=False)


def test_init_names_a_strategy_given_as_a_string():
    with pytest.raises(InvalidType, match=r"strategy must be a tf.distribute.Strategy object, got 'mirrored': pass "
                       r"e.g. tf.distribute.MirroredStrategy\(\), or leave strategy out"):
        elastic_tf.init(256, 64, strategy="mirrored", verbose=False)


def compiled(model):
    model.compile(optimizer=keras.optimizers.SGD(1e-3), loss="mse")
    return model


def arrays(samples: int):
    return np.zeros((samples, 4), "float32"), np.zeros((samples, 3), "float32")


def test_lr_finder_names_empty_train_data():
    empty = tf.data.Dataset.from_tensor_slices(arrays(0)).batch(4)
    with pytest.raises(InvalidValue, match="train_data yields no batches"):
        LRFinder(compiled(mlp())).range_test(empty, num_iter=3, progress_bar=False)


def test_lr_finder_names_empty_val_data():
    empty = tf.data.Dataset.from_tensor_slices(arrays(0)).batch(4)
    with pytest.raises(InvalidValue, match="val_data yields no samples: give a validation set with data, or leave"):
        LRFinder(compiled(mlp())).range_test(arrays(8), val_data=empty, num_iter=3, progress_bar=False)


def test_lr_finder_names_a_model_without_weights():
    model = compiled(keras.Sequential([keras.Input((4,)), keras.layers.ReLU()]))
    with pytest.raises(InvalidValue, match="the model has no trainable weights"):
        LRFinder(model)


# ---- issue 29: the last raw errors a new user met, each now named with its fix ------------------


def test_init_refuses_more_devices_than_exist_with_the_torch_message():
    """The same refusal and fix as aikit.elastic.Torch.init's (tests/torch/test_elastic_init.py)."""
    with pytest.raises(InvalidValue) as raised:
        elastic_tf.init(256, 64, gpus=4, verbose=False)
    assert str(raised.value) == (
        "gpus=4 but only 1 device(s) can be used here (_DefaultDistributionStrategy): pass gpus=1 or fewer, or leave "
        "gpus out; init plans the machine it runs on, so for a machine with 4 devices run `aikit plan "
        "--global-batch-size 256 --max-device-batch 64 --gpus 4` or call aikit.core.plan.make_plan(256, 64, 4)")


def test_ga_steps_beyond_int64_are_named():
    """TensorFlow said "Can't convert Python sequence with out-of-range integer to Tensor"."""
    with pytest.raises(InvalidValue) as raised:
        Optimizer(keras.optimizers.SGD(0.1), 2**63)
    assert str(raised.value) == ("steps must be at most 2**63 - 1, got 9223372036854775808: Keras keeps the GA steps "
                                 "in an int64 variable")
    optimizer = Optimizer(keras.optimizers.SGD(0.1), 2**63 - 1)  # the largest fits
    with pytest.raises(InvalidValue, match="steps must be at most 2"):
        optimizer.steps = 2**64
    assert optimizer.steps == 2**63 - 1


def test_ga_apply_of_no_gradient_at_all_is_named():
    """Keras' error came through its Cond.call ("Exception encountered when calling Cond.call()")."""
    model = mlp()
    optimizer = Optimizer(keras.optimizers.SGD(0.1), 1)
    with pytest.raises(InvalidValue) as raised:
        optimizer.apply([None] * len(model.trainable_variables), model.trainable_variables)
    assert str(raised.value) == (
        "apply() got no gradient for any of the 4 variables (all None): the loss does not depend on them; check "
        "that the model's output reaches the loss (Keras refuses this too: 'No gradients provided for any "
        "variable')")
    assert optimizer.micro_steps.numpy() == 0  # refused before anything was counted


def test_lr_finder_names_x_and_y_of_different_lengths():
    """TensorFlow said "Dimensions 64 and 10 are not compatible"."""
    x, y = np.zeros((64, 4), "float32"), np.zeros((10, 3), "float32")
    with pytest.raises(InvalidValue) as raised:
        LRFinder(compiled(mlp())).range_test((x, y), num_iter=3, progress_bar=False)
    assert str(raised.value) == ("`train_data` holds arrays of different lengths (x 64, y 10): give one entry per "
                                 "sample in each")
    with pytest.raises(InvalidValue, match=r"`val_data` holds arrays of different lengths \(x 8, y 8, sample_weight "
                                           r"7\)"):
        LRFinder(compiled(mlp())).range_test(arrays(8), val_data=(*arrays(8), np.ones(7)), num_iter=3,
                                             progress_bar=False)


def test_lr_finder_to_csv_into_a_folder_is_named(tmp_path):
    """open() raised IsADirectoryError."""
    finder = LRFinder(compiled(mlp()))
    finder.range_test(arrays(16), num_iter=3, progress_bar=False)
    with pytest.raises(InvalidValue) as raised:
        finder.to_csv(tmp_path)
    assert str(raised.value) == f"cannot write {tmp_path}: it is a folder; give a file name, e.g. lr_finder.csv"
    finder.to_csv(tmp_path / "lr.csv")
    assert (tmp_path / "lr.csv").read_text().startswith("lr,loss\n")

"""Issue 13's bad inputs to the Keras adapters: TF.init with a huge batch or a strategy given by
name, and the Keras LR finder's empty data and empty model."""

from __future__ import annotations

import numpy as np
import pytest
import tensorflow as tf
from tf_common import keras, mlp

import aikit.elastic.TF as elastic_tf
from aikit.core.errors import InvalidType, InvalidValue
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

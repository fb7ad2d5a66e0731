"""CustomSampler: the seed's two constructor forms, exact micro-batches per replica, len(),
resume mid-epoch, and clear errors."""

import numpy as np
import pytest
from hypothesis import given, settings
from hypothesis import strategies as st
from torch.utils.data import DataLoader, TensorDataset
from trace_common import dataset

from aikit.core.trace import TraceExhaustedError
from aikit.elastic.Torch import CustomSampler


@st.composite
def setups(draw):
    mb = draw(st.integers(1, 6))
    replicas = draw(st.integers(1, 4))
    size = draw(st.integers(mb * 3, 300))
    sizes = draw(st.lists(st.integers(1, size // mb).map(lambda k: k * mb), min_size=1, max_size=40))
    return size, sizes, replicas, mb, draw(st.integers(0, 1000))


@settings(max_examples=80, deadline=None)
@given(setups(), st.integers(0, 2))
def test_replicas_together_train_each_scheduled_sample_once(setup, epoch):
    size, sizes, replicas, mb, seed = setup
    samplers = [CustomSampler(size, sizes, seed, replicas, r, mb, when_exhausted="cycle") for r in range(replicas)]
    seen = []
    for sampler in samplers:
        sampler.set_epoch(epoch)
        batches = list(sampler)
        assert len(batches) == len(sampler)  # len() is what one epoch yields
        assert all(len(b) == mb for b in batches)  # static shapes
        seen += [i for b in batches for i in b]
    plan = samplers[0].epoch_schedule
    assert len(seen) == len(set(seen)) == plan.samples  # none lost, none repeated
    assert plan.samples > size - max(sizes)  # at most one step's worth is left for next epoch


def test_dataset_int_and_dataset_size_keyword_agree():
    data = dataset(100)
    by_dataset = CustomSampler(data, [8, 16], num_replicas=2, rank=1, minibatch_size=4, when_exhausted="cycle")
    by_size = CustomSampler(dataset_size=len(data), trace=[8, 16], num_replicas=2, rank=1, minibatch_size=4,
                            when_exhausted="cycle")
    assert list(by_dataset) == list(by_size) == list(CustomSampler(100, [8, 16], 42, 2, 1, 4, when_exhausted="cycle"))


def test_runtime_defaults_to_one_replica_and_works_as_a_batch_sampler():
    data = TensorDataset(dataset(64).tensors[1][:, 1])
    sampler = CustomSampler(data, 16, minibatch_size=8)  # an int trace is a constant batch
    assert (sampler.num_replicas, sampler.rank) == (1, 0)
    got = np.concatenate([x.numpy() for (x,) in DataLoader(data, batch_sampler=sampler)])
    assert sorted(got.astype(int).tolist()) == list(range(64))


def test_epochs_are_fresh_permutations_and_repeatable():
    sampler = CustomSampler(60, 12, minibatch_size=4)
    first = list(sampler)
    sampler.set_epoch(1)
    assert list(sampler) != first
    sampler.set_epoch(0)
    assert list(sampler) == first


@settings(max_examples=40, deadline=None)
@given(setups(), st.data())
def test_state_dict_resumes_mid_epoch_with_the_same_batches(setup, data):
    size, sizes, replicas, mb, seed = setup
    rank = data.draw(st.integers(0, replicas - 1))
    sampler = CustomSampler(size, sizes, seed, replicas, rank, mb, when_exhausted="cycle")
    sampler.set_epoch(1)
    whole = list(sampler)
    stop = data.draw(st.integers(0, len(whole)))
    sampler.set_epoch(1)
    iterator = iter(sampler)
    head = [next(iterator) for _ in range(stop)]
    state = sampler.state_dict()
    fresh = CustomSampler(size, sizes, seed, replicas, rank, mb, when_exhausted="cycle")
    fresh.load_state_dict(state)
    fresh.set_epoch(1)  # the training loop's call keeps the loaded position
    assert len(fresh) == len(whole) - stop
    assert head + list(fresh) == whole


def test_bad_inputs_name_the_value_and_the_fix():
    with pytest.raises(ValueError, match=r"rank must be an integer in 0..1, got 2"):
        CustomSampler(100, [8], num_replicas=2, rank=2, minibatch_size=4)
    with pytest.raises(ValueError, match=r"batch size 10 is not a multiple of minibatch_size 4; use 8 or 12"):
        CustomSampler(100, [8, 10], minibatch_size=4)
    with pytest.raises(ValueError, match="not both"):
        CustomSampler(100, [8], dataset_size=100)
    with pytest.raises(ValueError, match="needs a trace"):
        CustomSampler(100)
    with pytest.raises(ValueError, match="sized Dataset or an int, got object"):
        CustomSampler(object(), [8])
    with pytest.raises(ValueError, match="minibatch_size must be a positive integer, got 0"):
        CustomSampler(100, [8], minibatch_size=0)


def test_a_trace_that_runs_out_is_an_error_naming_the_fix_not_an_index_error():
    sampler = CustomSampler(40, [8, 8, 8, 8, 8, 8], minibatch_size=4)  # 48 samples: one epoch of 40
    assert len(list(sampler)) == 10
    with pytest.raises(TraceExhaustedError, match=r"epoch 1 needs steps past the end of the trace.*when_exhausted"):
        sampler.set_epoch(1)
    stopping = CustomSampler(40, [8, 8, 8, 8, 8, 8], minibatch_size=4, when_exhausted="stop")
    stopping.set_epoch(1)  # the policy 'stop' trains the last, partial epoch
    assert len(list(stopping)) == 2


def test_set_world_re_deals_the_rest_of_the_epoch_without_losing_or_repeating_a_sample():
    trace, size = [64, 96, 128, 64, 32], 384  # one full epoch
    two = [CustomSampler(size, trace, num_replicas=2, rank=r, minibatch_size=32) for r in range(2)]
    trained = []
    for sampler in two:  # both ranks train steps 0 and 1, then the world shrinks/grows
        batches = iter(sampler)
        for _ in range(sampler.epoch_schedule.counts(sampler.rank)[:2].sum()):
            trained += next(batches)
    three = []
    for r in range(3):
        sampler = CustomSampler(size, trace, num_replicas=2, rank=min(r, 1), minibatch_size=32)
        sampler.resume(0, 2, 0)
        sampler.set_world(3, r)
        assert (sampler.num_replicas, sampler.rank, sampler.step) == (3, r, 2)
        three += [i for batch in sampler for i in batch]
    whole_epoch = CustomSampler(size, trace, num_replicas=1, rank=0, minibatch_size=32)
    expected = [i for batch in whole_epoch for i in batch]
    assert sorted(trained + three) == sorted(expected) and len(set(trained + three)) == len(expected)
    with pytest.raises(ValueError, match=r"rank must be an integer in 0..2, got 3"):
        CustomSampler(size, trace, num_replicas=2, rank=0, minibatch_size=32).set_world(3, 3)

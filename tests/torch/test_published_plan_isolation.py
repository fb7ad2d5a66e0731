"""The suite's isolation of what ``init()`` publishes (tests/conftest.py): a plan a module-scoped
fixture published before the tests, then a ragged plan one test published over it, must not be the
plan a later test's GA wrapper follows (under pytest-xdist the order of tests in a worker varies:
one order failed 21 GA tests, all refusing the leaked ragged plan)."""

import pytest
import torch

import aikit.elastic.Torch as elastic
from aikit.ga.Torch.optim import Optimizer


@pytest.fixture(scope="module", autouse=True)
def published_before_the_tests():
    elastic.init(256, 64)


def test_a_test_publishes_a_ragged_plan():
    assert elastic.init(256, 86).micro_steps == 3  # 86, 85, 85 per micro-step


def test_a_later_wrapper_follows_the_plan_published_before_it_not_the_ragged_one():
    assert elastic.plan.micro_steps == 4 and elastic.steps == 4
    model = torch.nn.Linear(2, 1)
    optimizer = Optimizer(torch.optim.SGD(model.parameters(), lr=0.1), 3)
    for _ in range(3):
        model(torch.ones(4, 2)).sum().backward()
        optimizer.step()
    assert optimizer.updated

# ruff: noqa: UP008, B905  (the original's code, kept as it was written)
"""Run:AI's AIkit's own GA test suite (run-ai/runai tests/test_ga_torch.py), run against aikit.

Ported with these changes only, each marked ``# aikit:`` where it is made:

* imports: ``runai.ga.torch`` is ``aikit.ga.Torch``; ``runai.utils.random`` is the original's
  helper, copied to ``runai_random``; the random draws are seeded, so a failure reproduces;
* Wet: the original *summed* the micro-batch gradients (its tests use a sum-reduced loss); aikit
  averages them by default, and ``reduction="sum"`` restores the original, so both GA forms get it;
* Dry: the original re-created the optimizer as a subclass of its own class and kept its counter
  in ``optimizer.state['runai']`` (``.steps``, ``.step``). aikit keeps the optimizer as it is and
  wraps it, so the counters are the wrapper's: ``wrapped.steps`` and ``wrapped.micro_steps``
  (every ``step()`` call, as ``runai.step``), saved in ``state_dict()['ga']``. The helper
  optimizer, no longer the wrapper itself, reads them through a reference the test gives it;
* Dry zero_grad: aikit also clears the gradients itself right after each update (so calling
  ``zero_grad`` is optional); the inner ``zero_grad`` is therefore called at every update
  boundary twice: after the update (micro-step ``k*steps - 1``) and by the loop (``k*steps``).
"""

import pickle
import random
import unittest

import numpy
import runai_random  # aikit: was `import runai.utils.random`
import torch

import aikit.ga.Torch  # aikit: was `import runai.ga.torch`


class Seeded(unittest.TestCase):  # aikit: seeded draws
    def setUp(self):
        random.seed(self.id())
        torch.manual_seed(0)


class Dry(Seeded):
    class Optimizer(torch.optim.Optimizer):  # a helper optimizer
        def __init__(self, params=None, defaults=None):
            if params is None:
                params = [torch.empty(runai_random.shape())]

            if defaults is None:
                defaults = dict()

            super(Dry.Optimizer, self).__init__(params=params, defaults=defaults)
            self.log_step = []
            self.log_zero_grad = []

        def step(self, closure=None):
            self.log_step.append(self.ga.micro_steps)  # aikit: was self.runai.step

            if closure is not None:
                return closure()

        def zero_grad(self):
            self.log_zero_grad.append(self.ga.micro_steps)  # aikit: was self.runai.step

    def testCreation(self):
        optimizer = Dry.Optimizer()
        steps = runai_random.number()
        wrapped = aikit.ga.Torch.optim.Optimizer(optimizer, steps)

        self.assertEqual(wrapped.steps, steps)  # aikit: was wrapped.runai.steps
        self.assertEqual(wrapped.micro_steps, 0)  # aikit: was wrapped.runai.step

    def testPickle(self):
        optimizer = Dry.Optimizer()
        steps = runai_random.number()
        wrapped = aikit.ga.Torch.optim.Optimizer(optimizer, steps)

        wrapped.micro_steps = runai_random.number()  # aikit: was wrapped.runai.step
        state = wrapped.state_dict()
        self.assertEqual(wrapped.micro_steps, state['ga']['micro_steps'])  # aikit: was state['state']['runai']
        self.assertEqual(wrapped.steps, state['ga']['steps'])
        dumped = pickle.dumps(state)
        loaded = pickle.loads(dumped)
        self.assertEqual(state['ga']['steps'], loaded['ga']['steps'])
        self.assertEqual(state['ga']['micro_steps'], loaded['ga']['micro_steps'])

    def testStep(self):
        optimizer = Dry.Optimizer()
        steps = runai_random.number()
        wrapped = aikit.ga.Torch.optim.Optimizer(optimizer, steps)
        optimizer.ga = wrapped  # aikit: the helper reads the wrapper's counter

        minimum = steps * 2
        maximum = steps * 100

        iterations = runai_random.number(minimum, maximum)

        for _ in range(iterations):
            wrapped.step()

        self.assertEqual(optimizer.log_step, list(range(steps - 1, iterations, steps)))  # aikit: the helper's log

    def testStepClosure(self):
        optimizer = Dry.Optimizer()
        steps = runai_random.number()
        wrapped = aikit.ga.Torch.optim.Optimizer(optimizer, steps)
        optimizer.ga = wrapped  # aikit: the helper reads the wrapper's counter

        minimum = steps * 2
        maximum = steps * 100

        iterations = runai_random.number(minimum, maximum)

        value = runai_random.number()

        for _ in range(iterations):
            closure = lambda: value  # noqa: E731
            loss = wrapped.step(closure)
            self.assertEqual(loss, value)

    def testZeroGrad(self):
        optimizer = Dry.Optimizer()
        steps = runai_random.number()
        wrapped = aikit.ga.Torch.optim.Optimizer(optimizer, steps)
        optimizer.ga = wrapped  # aikit: the helper reads the wrapper's counter

        minimum = steps * 2
        maximum = steps * 100

        iterations = runai_random.number(minimum, maximum)

        for _ in range(iterations):
            wrapped.zero_grad()
            wrapped.step()  # must be called to advance `runai.step`

        # aikit: the loop's calls at update starts, and aikit's own right after each update
        expected = sorted([*range(0, iterations, steps), *range(steps - 1, iterations, steps)])
        self.assertEqual(optimizer.log_zero_grad, expected)


class Wet(Seeded):
    def _run(self, seed, features, xs, ys, optimizer_fn):
        # convert single tensors to tuples
        if not isinstance(xs, tuple):
            xs = (xs,)

        if not isinstance(ys, tuple):
            ys = (ys,)

        # set PyTorch seed to get the same results
        torch.manual_seed(seed)

        # create a model
        model = torch.nn.Linear(in_features=features, out_features=features, bias=False)

        # create an optimizer
        optimizer = optimizer_fn(model.parameters())

        # create a loss function
        # we explicitly use 'sum' reduction and not 'mean' because
        # the number of samples is different when using GA
        loss_fn = torch.nn.MSELoss(reduction='sum')

        for x, y in zip(xs, ys):
            optimizer.zero_grad()
            predictions = model(x)
            loss = loss_fn(predictions, y)
            loss.backward()
            optimizer.step()

        return model.weight.detach().numpy()

    def _run_wo_ga(self, seed, features, name, x, y, **kwargs):
        return self._run(
            seed,
            features,
            x,
            y,
            lambda params: getattr(torch.optim, name)(params=params, **kwargs))

    def _run_ga_wrapped(self, seed, steps, features, name, xs, ys, **kwargs):
        return self._run(
            seed,
            features,
            xs,
            ys,
            lambda params: aikit.ga.Torch.optim.Optimizer(getattr(torch.optim, name)(params=params, **kwargs),
                                                          steps=steps, reduction="sum"))  # aikit: the sum switch

    def _run_ga_builtin(self, seed, steps, features, name, xs, ys, **kwargs):
        return self._run(
            seed,
            features,
            xs,
            ys,
            lambda params: getattr(aikit.ga.Torch.optim, name)(steps=steps, params=params,
                                                               reduction="sum", **kwargs))  # aikit: the sum switch

    def _test(self, name, **kwargs):
        seed = runai_random.number()

        # randomize test parameters
        steps = runai_random.number(2, 10)
        batch = runai_random.number(5, 10)
        samples = steps * batch
        features = runai_random.number(1, 5)
        shape = (samples, features)

        # generate dummy tensors
        x = torch.randn(shape)
        y = torch.randn(shape)

        # split them accordingly
        xs = x.split(batch, dim=0)
        ys = y.split(batch, dim=0)

        assert len(xs) == steps
        assert len(ys) == steps

        wo = self._run_wo_ga(seed, features, name, x, y, **kwargs)
        wrapped = self._run_ga_wrapped(seed, steps, features, name, xs, ys, **kwargs)
        builtin = self._run_ga_builtin(seed, steps, features, name, xs, ys, **kwargs)

        self.assertTrue(numpy.allclose(wo, wrapped))
        self.assertTrue(numpy.allclose(wrapped, builtin))

    def testAdadelta(self):
        self._test('Adadelta')

    def testAdagrad(self):
        self._test('Adagrad')

    def testAdam(self):
        self._test('Adam')

    def testAdamW(self):
        self._test('AdamW')

    def testAdamax(self):
        self._test('Adamax')

    def testASGD(self):
        self._test('ASGD')

    def testSGD(self):
        lr = 0.01 * runai_random.number(1, 10)
        self._test('SGD', lr=lr)

    def testRprop(self):
        self._test('Rprop')

    def testRMSprop(self):
        self._test('RMSprop')


if __name__ == '__main__':
    unittest.main()

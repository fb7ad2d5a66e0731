# ruff: noqa: E501  (the original's code, kept as it was written)
"""Run:AI's AIkit's own Keras GA test suite (run-ai/runai tests/test_ga_keras.py), run against aikit.

The original drove TF1-era Keras 2: it fed the gradients through ``K.placeholder`` and a hook on
``optimizer.get_gradients``, then ran ``optimizer.get_updates`` in a ``K.get_session()``. Keras 3
has none of these; it applies given gradients directly with ``optimizer.apply(gradients,
variables)``, so ``_run`` does that (marked ``# aikit:``). Everything else, each test's
assertions included, is as written: ``count`` random variables get ``steps`` random gradients
through the GA optimizer, and must equal one step of the plain optimizer on their mean (the
original's Keras wrapper averaged, as aikit's does by default); the wrapper's class is
``Optimizer``, a prebuilt one's class is the optimizer's name, and ``.optimizer`` is the Keras
optimizer it wraps. The imports change (``runai.ga.keras`` is ``aikit.ga.TF``) and the random
draws are seeded, so a failure reproduces.
"""

import random
import unittest

import keras  # aikit: was `import keras.backend as K` and `import keras.optimizers`
import numpy as np

import aikit.ga.TF  # aikit: was `import runai.ga.keras`


class Optimizer(unittest.TestCase):
    def setUp(self):  # aikit: seeded draws
        random.seed(self.id())
        np.random.seed(random.randint(0, 2**31))

    def _run(self, params, gradients, optimizer):
        params = [keras.Variable(param) for param in params]  # aikit: Keras 3 variables

        for step in range(len(gradients)):
            optimizer.apply(gradients[step], params)  # aikit: was a session run of get_updates fed with gradients

        return [param.numpy() for param in params]  # aikit: was K.get_session().run(params)

    def _test(self, name):
        count = random.randint(2, 10)
        steps = random.randint(2, 10)
        shape = [random.randint(2, 5) for _ in range(2, 5)]

        # numpy generates float64 values by default, whereas TF uses float32 by default
        # we explictly generate float32 values because passing 64-bit floats to TF causes floating-point issues
        params = [np.random.random(shape).astype(np.float32) for _ in range(count)]
        gradients = [[np.random.random(shape).astype(np.float32) for _ in range(count)] for _ in range(steps)]

        them = self._run(
            params,
            [[np.array([gradients[step][i] for step in range(steps)]).sum(axis=0) / steps for i in range(count)]], # running a single step with the reduced (sum) gradients
            getattr(keras.optimizers, name)()
        )

        wrapped = aikit.ga.TF.optimizers.Optimizer(getattr(keras.optimizers, name)(), steps=steps)
        self.assertEqual(wrapped.__class__.__name__, 'Optimizer')

        specific = getattr(aikit.ga.TF.optimizers, name)(steps=steps)
        self.assertEqual(specific.__class__.__name__, name)

        for optimizer in [wrapped, specific]:
            self.assertEqual(optimizer.optimizer.__class__.__name__, name) # optimizer.optimizer is the Keras optimizer

            us = self._run(
                params,
                gradients,
                optimizer
            )

            self.assertTrue(np.allclose(us, them))

    def testSGD(self):
        self._test('SGD')

    def testRMSprop(self):
        self._test('RMSprop')

    def testAdagrad(self):
        self._test('Adagrad')

    def testAdadelta(self):
        self._test('Adadelta')

    def testAdam(self):
        self._test('Adam')

    def testAdamax(self):
        self._test('Adamax')

    def testNadam(self):
        self._test('Nadam')

if __name__ == '__main__':
    unittest.main()

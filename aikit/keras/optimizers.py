"""Gradient accumulation for a Keras 3 optimizer, on every backend: k calls to ``apply`` make one real update.

``Optimizer(keras.optimizers.Adam(1e-3), steps=4)`` sums the gradients of 4 micro-batches
and then lets the wrapped optimizer apply their mean once. Everything the wrapped optimizer
does per update -- its iteration count (Adam's bias correction, LR schedules), weight decay,
clipping, EMA, constraints -- therefore happens once per real update, as with one big batch
(Keras' own ``gradient_accumulation_steps`` showed LR schedules the micro-step count and
cannot run under ``tf.distribute``, keras#19990 and tf-keras#301).

Written once on ``keras.ops`` and Keras variables, in the pattern of Keras' ``LossScaleOptimizer``:
every piece of state is a variable the optimizer tracks (``variables``), ``apply`` serves
TensorFlow and torch and Keras' own ``stateless_apply`` (``apply`` in a ``StatelessScope``) serves
JAX's pure, jitted step. A micro-step only adds its gradients; the update runs once, on the
window's last micro-step, in a condition the backend's seam takes
(:mod:`aikit.runtime.Keras.backend`): a ``tf.cond`` (under a ``tf.distribute`` strategy taken in
cross-replica context, inside one ``merge_call``: each replica accumulates into its own
``ON_READ`` variables and the wrapped optimizer's one all-reduce per update is the only
cross-replica reduction), a ``jax.lax.cond`` over pure branches, or on torch a Python ``if`` on
the window's position known on the host (no read per micro-step).

The number of steps lives in a variable: ``optimizer.steps = 8`` takes effect from
the next update without retracing (batch-size traces change it every update). The update
divides the sums by what ``aikit.core.ga`` says (``accumulated_divisor``, applied in the graph,
once per update, to the micro-steps actually accumulated), so it is the mean even when ``steps``
changes in the middle of an update.
Loading saved weights (``model.load_weights``) keeps the ``steps`` of the plan compiled now.

``reduction="sum"`` applies the sum of the micro-batch gradients instead of their mean (for a
sum-reduced loss); Run:AI's original Keras wrapper averaged. Left out, the reduction is the
compiled loss's (:mod:`aikit.keras.reduction`): the sum for a Keras loss made with
``reduction="sum"``, else the mean; one given that the compiled loss contradicts is refused.

An update whose gradient is inf or NaN is skipped in the graph, the weights and ``iterations``
left as they were (:mod:`aikit.keras.skipping`); ``skip_nonfinite=False`` applies it, as Keras'
optimizers do.

Run:AI's prebuilt GA optimizers are here too, one per optimizer class Keras ships (found at
import: the classes built from a ``learning_rate``, so not the ``Optimizer`` base nor the
``LossScaleOptimizer``/``MultiOptimizer`` wrappers), in the original's argument order:
``Adam(steps, learning_rate=1e-3)`` is ``Optimizer(keras.optimizers.Adam(learning_rate=1e-3), steps)``.
"""

from __future__ import annotations

import inspect

from aikit.core.errors import InvalidType, InvalidValue
from aikit.core.ga import accumulated_divisor, mean_scale, reduction_name
from aikit.core.skips import MAX_SKIPS_IN_A_ROW, checked_max_skips
from aikit.core.validate import checked_bool, positive_int
from aikit.keras.precision import check_float64
from aikit.keras.reduction import building_model, compiled_reduction, mismatch
from aikit.keras.saved import load_keeping_steps, save_variables
from aikit.keras.skipping import SkippedUpdates
from aikit.runtime.exports import served
from aikit.runtime.Keras.backend import check_backend, keras, ops, seam, to_numpy

MAX_STEPS = seam.INT_MAX  # the GA steps live in an int64 variable (int32 on JAX without x64)


def checked_steps(steps: object) -> int:
    """``steps`` as the int a Keras GA optimizer can hold, or an aikit error naming it."""
    steps = positive_int(steps, "steps")
    if steps > MAX_STEPS:
        size = "2**63 - 1" if MAX_STEPS == 2**63 - 1 else "2**31 - 1"
        kind = "an int64 variable" if MAX_STEPS == 2**63 - 1 else "an int32 variable (JAX without jax_enable_x64)"
        raise InvalidValue(f"steps must be at most {size}, got {steps}: Keras keeps the GA steps in {kind}")
    return steps


@keras.saving.register_keras_serializable(package="aikit")
class Optimizer(SkippedUpdates, keras.optimizers.Optimizer):
    """Accumulate gradients over ``steps`` calls, then apply their mean with ``optimizer``.

    Args:
        optimizer: the Keras 3 optimizer that makes the real updates (its LR, weight decay,
            clipping and schedules are used as configured).
        steps: micro-steps per update (1: no accumulation); may be changed later by
            assigning ``.steps``.
        reduction: ``"mean"`` applies the mean of the micro-batch gradients, right for a mean loss;
            ``"sum"`` applies their sum, right for a sum-reduced loss; None (default): the loss's the
            model is compiled with (``"mean"`` in a custom loop). A model whose loss needs the other
            is refused when it builds or compiles this optimizer.
        skip_nonfinite: skip an update whose gradient is inf or NaN (default); False applies it.
        max_skips_in_a_row: this many skipped in a row raise ``TrainingFailed`` where ``apply``
            runs eagerly (default 10; None: never).
    """

    def __init__(self, optimizer: keras.optimizers.Optimizer, steps: int = 1, name: str | None = None,
                 reduction: str | None = None, skip_nonfinite: bool = True,
                 max_skips_in_a_row: int | None = MAX_SKIPS_IN_A_ROW, **kwargs):
        check_backend("aikit's GA Optimizer")
        optimizer = _checked_inner(optimizer, kwargs)
        steps = checked_steps(steps)
        reduction = None if reduction is None else reduction_name(reduction)
        checked_bool(skip_nonfinite, "skip_nonfinite")
        checked_max_skips(max_skips_in_a_row)  # both refused before anything is made
        super().__init__(learning_rate=lambda: self.inner.learning_rate, name=name)
        self.reduction = reduction or "mean"
        self._reduction_given = reduction is not None  # else the compiled loss's (match_loss)
        self.inner = optimizer
        with keras.name_scope(self.name, caller=self):
            self._micro_steps = keras.Variable(steps, name="steps", dtype="int64", trainable=False,
                                         aggregation="only_first_replica")
            # micro-steps already summed into the accumulators for the coming update
            self._accumulated = keras.Variable(0, name="accumulated", dtype="int64", trainable=False,
                                               aggregation="only_first_replica")
            # loss terms (apply(weight=n), TokenMean): this replica's sum towards the coming update,
            # and the weight a loss declared for the running micro-step (declare_weight)
            self._terms = keras.Variable(0.0, name="terms", dtype="float64", trainable=False,
                                         synchronization="on_read", aggregation="sum")
            self._declared_weight = keras.Variable(0.0, name="declared_weight", dtype="float64", trainable=False,
                                                   synchronization="on_read", aggregation="sum")
        self._weighs_terms = False  # set once a micro-step declares its loss terms (traced into apply and update)
        self._weight_from_loss = False  # set once a loss declares them (TokenMean)
        self._declared = None  # JAX and torch: the weight a loss declared, handed to the next apply in its step
        self._init_skips(skip_nonfinite, max_skips_in_a_row)

    def build(self, variables):
        """Create one per-replica accumulator per variable, and the wrapped optimizer's state; take
        the reduction of the loss of the model whose fit builds it."""
        model = building_model(self)
        if model is not None:
            self.match_loss(model)
        check_float64("aikit's GA Optimizer", variables)
        super().build(variables)
        if not self.inner.built:
            self.inner.build(variables)
        with keras.name_scope(self.name, caller=self):
            self._accumulators = [
                keras.Variable(
                    keras.initializers.Zeros(), shape=v.shape, dtype=v.dtype, trainable=False,
                    name=f"{getattr(v, 'path', v.name).replace('/', '_')}_accumulator",
                    # each replica keeps its own sum until the update; a read across replicas sums
                    synchronization="on_read", aggregation="sum",
                )
                for v in variables
            ]

    def match_loss(self, model) -> None:
        """Take the GA reduction the losses ``model`` is compiled with need (the sum for a loss with
        ``reduction="sum"``), or refuse the one this optimizer was given if they need the other."""
        if self._reduction_given:
            wrong = mismatch(model, self.reduction)
            if wrong:
                raise InvalidValue(wrong)
        else:
            self.reduction = compiled_reduction(model) or self.reduction

    @property
    def steps(self) -> int:
        """Micro-steps per update."""
        return int(to_numpy(self._micro_steps))

    @steps.setter
    def steps(self, steps: int) -> None:
        self._micro_steps.assign(checked_steps(steps))

    @property
    def optimizer(self) -> keras.optimizers.Optimizer:
        """The wrapped optimizer (also ``inner``), under the name the torch wrapper and Run:AI's
        original give it."""
        return self.inner

    @property
    def accumulated(self) -> int:
        """Micro-steps summed so far towards the coming update (0 right after an update)."""
        return int(to_numpy(self._accumulated))

    @property
    def micro_steps_taken(self):
        """Every call to ``apply`` so far (``iterations`` counts real updates)."""
        return self._iterations

    @property
    def micro_steps(self):
        """:attr:`micro_steps_taken` by its first name (kept where users wrote it)."""
        return self._iterations

    @property
    def iterations(self):
        return self.inner.iterations

    @property
    def learning_rate(self):
        return self.inner.learning_rate

    @learning_rate.setter
    def learning_rate(self, learning_rate):
        self.inner.learning_rate = learning_rate

    @property
    def variables(self):
        """Every variable of the optimizer's state: what it saves, then its skip counts."""
        return self._saved_variables + self._skip_counts

    @property
    def _saved_variables(self):
        return self._variables + self.inner.variables

    def _state_variables(self) -> list:
        """What an update may assign: the model's variables and the optimizer's."""
        return [*self._trainable_variables, *self.variables]

    def load_own_variables(self, store) -> None:
        """Load the saved variables, keeping this optimizer's ``steps`` (``saved.load_keeping_steps``)."""
        load_keeping_steps(self, store)

    def save_own_variables(self, store) -> None:
        """The variables Keras saved before the skip counts were variables (``saved.save_variables``)."""
        save_variables(self, store)

    def scale_loss(self, loss):
        return self.inner.scale_loss(loss)

    def finalize_variable_values(self, var_list):
        """The wrapped optimizer's (EMA); ``Model.fit`` calls it once at its end, in Python: the
        warning of updates its compiled steps skipped comes here."""
        self.inner.finalize_variable_values(var_list)
        self._report_skips()

    def declare_weight(self, weight) -> None:
        """Declare the running micro-step's loss terms from inside its loss (what
        :class:`aikit.ga.TF.tokens.TokenMean` does in ``Model.fit``): the next :meth:`apply` on
        this replica weighs its gradients by ``weight``, as ``apply(..., weight=weight)`` would."""
        self._check_weighable(weight)
        self._weight_from_loss = True
        if seam.PER_REPLICA_DECLARATION:
            self._declared_weight.assign(ops.cast(weight, "float64"))
        else:
            self._declared = ops.cast(weight, "float64")

    def _check_weighable(self, weight) -> None:
        if self.reduction == "sum":
            raise InvalidValue(
                f"weight={weight} weighs a mean loss's micro-batch by its loss terms, but this optimizer sums the "
                "micro-batch gradients (reduction='sum'), where a summed loss already counts its terms: leave out "
                "the weight, or use reduction='mean' with a mean loss"
            )
        if isinstance(weight, (int, float)) and not weight >= 0:
            raise InvalidValue(
                f"weight must be a number >= 0, got {weight!r}: the number of loss terms whose mean is this "
                "micro-batch's loss (for a language model, its tokens whose label is not ignored), or the sum of "
                "their sample weights"
            )

    def apply(self, grads, trainable_variables=None, weight=None):
        """Add ``grads`` to this replica's sums; on the last micro-step apply their mean.

        ``weight``: the loss terms whose mean this micro-batch's loss is (a language model's
        tokens whose label is not ignored, or the sum of their sample weights; a number or a
        scalar tensor). Give it in every micro-step of an update (or let a :class:`TokenMean`
        loss declare it): the update is then Σ nᵢ·gᵢ / Σ nᵢ over every micro-step and replica,
        the per-term mean of the whole update, not the mean of the micro-batch means. A
        micro-batch of weight 0 adds exactly nothing (even a NaN gradient)."""
        seam.check_apply_context(self.built)
        if not self.built:
            with keras.name_scope(self.name, caller=self):
                self.build(trainable_variables)
        variables = self._trainable_variables if trainable_variables is None else list(trainable_variables)
        grads = list(grads)
        if len(grads) != len(variables):
            raise InvalidValue(f"apply() got {len(grads)} gradients for {len(variables)} variables")
        if grads and all(grad is None for grad in grads):
            raise InvalidValue(
                f"apply() got no gradient for any of the {len(grads)} variables (all None): the loss does not depend "
                "on them; check that the model's output reaches the loss (Keras refuses this too: 'No gradients "
                "provided for any variable')"
            )
        sums = [None if g is None else self._accumulators[self._index_of(v)]
                for g, v in zip(grads, variables, strict=True)]
        if weight is not None:
            self._check_weighable(weight)
        elif self._weight_from_loss:
            weight = self._declared_weight.value if seam.PER_REPLICA_DECLARATION else self._take_declared()
        if weight is not None:
            self._weighs_terms = True
            weight = ops.cast(weight, "float64")
            self.assign_add(self._terms, weight)
        present = [(total, grad) for total, grad in zip(sums, grads, strict=True) if grad is not None]
        seam.add_to(self, [total for total, _ in present],
                    [grad if weight is None else _weighed(grad, weight) for _, grad in present])

        is_update = None
        if not seam.merged_update(self, sums, variables):  # (TensorFlow's replicas: taken across them)
            is_update = self._maybe_update(lambda: self._update_if_finite(lambda: self._replicas_nonfinite(sums),
                                                                          lambda: self._update(sums, variables),
                                                                          lambda: self._skip(sums)))
        if self._checks_finite and is_update is not False and seam.eager(self._counts.in_a_row.value):
            self._check_skips()  # (torch: only after an update, which the host knows: no read per micro-step)

    def _take_declared(self):
        """The weight a loss declared in this step (JAX, torch), handed over once."""
        if self._declared is None:
            raise InvalidValue(
                "a loss declared micro-batch weights before (TokenMean), but none for this micro-step: compute every "
                "micro-step's loss with the TokenMean of this optimizer, or pass apply(..., weight=n)"
            )
        weight, self._declared = self._declared, None
        return weight

    def _index_of(self, variable) -> int:
        try:
            return self._get_variable_index(variable)
        except KeyError:
            raise InvalidValue(
                f"apply() got a gradient for variable {getattr(variable, 'path', variable.name)!r}, which this GA "
                "optimizer was not built for: it accumulates the variables of its first apply() or build(); "
                "apply gradients for those, or build a new optimizer for the new variables"
            ) from None

    def _maybe_update(self, update):
        """Run ``update`` when this micro-step completes the update, and count the micro-step."""
        is_update = seam.window_ends(self._accumulated, self._micro_steps)
        if is_update is not False:  # (False: known on the host, torch's micro-step that only added its gradients)
            seam.cond(is_update, update, lambda: None, self._state_variables())
        seam.advance(self._accumulated, is_update)
        self._iterations.assign_add(1)
        return is_update

    def _skip(self, sums) -> None:
        """A skipped update (replica context): the sums and the loss terms cleared, nothing applied."""
        seam.clear([total for total in sums if total is not None])
        if self._weighs_terms:
            self._terms.assign(ops.zeros((), "float64"))

    def _update(self, sums, variables) -> None:
        """The real update (replica context): the wrapped optimizer applies the mean gradient."""
        present = [total for total in sums if total is not None]
        if self._weighs_terms:  # Σ nᵢ·gᵢ over the replicas (Keras sums them) / Σ nᵢ over the replicas
            scale = self._terms_scale()
            means = [total.value * ops.cast(scale, total.dtype) for total in present]
        else:  # of aikit.core.ga: mean or sum
            means = seam.divided(present, accumulated_divisor(self._accumulated + 1, self.reduction))
        means = iter(means)
        self.inner.apply([None if total is None else next(means) for total in sums], variables)
        seam.clear(present)

    def _terms_scale(self):
        """:func:`aikit.core.ga.mean_scale` of this update's loss terms, summed over the replicas
        (an all-reduce of one number, in the update only), times the replicas whose sum Keras
        takes of gradients scaled for distribution; the count is reset. An update without any
        term (a graph cannot refuse it) steps on a zero gradient."""
        total = seam.replicas_sum(ops.copy(self._terms.value))  # a value: the variable is reset below
        self._terms.assign(ops.zeros((), "float64"))
        return mean_scale(ops.where(total > 0, total, ops.ones_like(total)), 1, seam.replicas())

    def get_config(self) -> dict:
        return {"name": self.name, "optimizer": keras.optimizers.serialize(self.inner), "steps": self.steps,
                "reduction": self.reduction if self._reduction_given else None, "skip_nonfinite": self.skip_nonfinite,
                "max_skips_in_a_row": self.max_skips_in_a_row}

    @classmethod
    def from_config(cls, config, custom_objects=None):
        config = dict(config)
        inner = keras.optimizers.deserialize(config.pop("optimizer"), custom_objects=custom_objects)
        restored = cls.__new__(cls)  # a prebuilt subclass takes other arguments: wrap the saved inner as is
        Optimizer.__init__(restored, inner, **config)
        return restored


def _checked_inner(optimizer: object, kwargs: dict) -> keras.optimizers.Optimizer:
    """The Keras optimizer a GA Optimizer wraps (made from a saved config), refused where it cannot
    (an aikit GA optimizer, one that accumulates itself) or where ``kwargs`` sets what is its."""
    if kwargs:
        raise InvalidValue(
            f"aikit's GA Optimizer takes only optimizer, steps, name, reduction, skip_nonfinite and "
            f"max_skips_in_a_row, got {sorted(kwargs)}: set learning rate, weight decay, clipping and EMA on "
            "the wrapped optimizer"
        )
    if isinstance(optimizer, dict):  # from a saved config
        optimizer = keras.optimizers.deserialize(optimizer)
    if not isinstance(optimizer, keras.optimizers.Optimizer):
        raise InvalidType(
            f"optimizer must be a Keras 3 optimizer instance such as keras.optimizers.Adam(1e-3), "
            f"got {type(optimizer).__name__}"
        )
    if isinstance(optimizer, Optimizer):
        raise InvalidValue("optimizer is already an aikit GA Optimizer: set its .steps instead of wrapping it")
    if optimizer.gradient_accumulation_steps:
        raise InvalidValue(
            f"optimizer already accumulates with Keras' gradient_accumulation_steps="
            f"{optimizer.gradient_accumulation_steps}: create it without that argument and let "
            "aikit accumulate"
        )
    return optimizer


def _weighed(grad, weight):
    """``grad`` times ``weight``, exactly zero where the weight is 0 (a micro-batch without loss
    terms, whose mean-loss gradient may be NaN)."""
    weight = ops.cast(weight, grad.dtype)
    return ops.where(weight != 0, grad * weight, ops.zeros_like(grad))


def _prebuilt(inner: type[keras.optimizers.Optimizer]) -> type[Optimizer]:
    """Run:AI's prebuilt GA form of ``inner``: ``Name(steps, *args, reduction=None, **kwargs)``
    wraps ``inner(*args, **kwargs)``."""

    def __init__(self, steps: int, *args, reduction: str | None = None, skip_nonfinite: bool = True,
                 max_skips_in_a_row: int | None = MAX_SKIPS_IN_A_ROW, **kwargs):
        Optimizer.__init__(self, inner(*args, **kwargs), steps, reduction=reduction, skip_nonfinite=skip_nonfinite,
                           max_skips_in_a_row=max_skips_in_a_row)

    name = inner.__name__
    __init__.__qualname__ = f"{name}.__init__"
    doc = (f"GA over ``keras.optimizers.{name}``: ``{name}(steps, ...)`` is "
           f"``Optimizer(keras.optimizers.{name}(...), steps)``; ``reduction``, ``skip_nonfinite`` and "
           f"``max_skips_in_a_row`` go to :class:`Optimizer`, "
           f"every other argument to ``keras.optimizers.{name}``.")
    cls = type(name, (Optimizer,), {"__init__": __init__, "__doc__": doc, "__module__": __name__,
                                    "__qualname__": name, "inner_class": inner})
    return keras.saving.register_keras_serializable(package="aikit")(cls)


def _keras_optimizer_classes() -> list[type[keras.optimizers.Optimizer]]:
    """Every optimizer algorithm keras.optimizers exports: the classes built from a learning rate."""
    return [cls for cls in (getattr(keras.optimizers, name) for name in dir(keras.optimizers))
            if inspect.isclass(cls) and issubclass(cls, keras.optimizers.Optimizer)
            and "learning_rate" in inspect.signature(cls.__init__).parameters]


PREBUILT = {cls.__name__: _prebuilt(cls) for cls in _keras_optimizer_classes()}  # made once, registered with Keras
__getattr__, __dir__ = served(__name__, PREBUILT)  # aikit.keras.optimizers.Adam (aikit.ga.TF...) and the rest

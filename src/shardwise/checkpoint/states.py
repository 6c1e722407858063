"""What a checkpoint holds: *state objects*, torch's ``Stateful`` protocol.

A state object has ``state_dict()`` and ``load_state_dict(state_dict)``, as torch's modules
and optimizers do (and torchtitan's ``ModelWrapper`` and ``OptimizersContainer``). The
:class:`~shardwise.checkpoint.checkpointer.Checkpointer` saves and loads whatever objects it
is given, by checkpoint key: a strategy registers its model, optimizers and schedulers
(:mod:`shardwise.strategies.states`) and the random state (:class:`RandomState`), a runner its
loop position and message hub, and any caller what it likes.

Optional methods let a state object take part in the Checkpointer's guarantees:

- ``fit_state_dict(saved) -> (saved, problems)``: the saved entry put in the shape
  ``load_state_dict`` takes, and what keeps it from fitting (a resume loads nothing unless
  every state fits);
- ``register_pre_change_hook(fn)``: call ``fn()`` before the object changes its saved tensors
  in place (an optimizer step, a forward that updates buffers), so an asynchronous save can
  finish copying them first;
- ``local_state_dict()`` / ``load_local_state_dict(state_dict)``: this rank's part of the state
  alone, taken and loaded *without any collective*, for a peer rank of the same layout (a
  replica group healing rank by rank from a live one: :meth:`Checkpointer.local_state_dict
  <shardwise.checkpoint.checkpointer.Checkpointer.local_state_dict>`). An object without them
  is taken with ``state_dict()``, which must then be collective-free.
"""

from __future__ import annotations

from collections.abc import Callable, Mapping
from typing import Any, Protocol, runtime_checkable

from shardwise import dist
from shardwise.env import capture_rng_state, restore_rng_state

__all__ = ["RandomState", "Stateful"]


@runtime_checkable
class Stateful(Protocol):
    """torch's protocol of an object a checkpoint holds."""

    def state_dict(self) -> Any: ...

    def load_state_dict(self, state_dict: Any) -> None: ...


class RandomState:
    """Every rank's random state and the run's seed, kept in a checkpoint's ``meta``.

    Args:
        randomness: the run's ``dict(seed, diff_rank_seed, deterministic)``, read at save.
        reseed: sets the run's randomness from a checkpoint's seed (when it differs).
        logger: where a replaced seed or a changed world size is reported.
    """

    def __init__(
        self,
        randomness: Callable[[], Mapping[str, Any]],
        reseed: Callable[[int], None],
        logger: Any,
    ) -> None:
        self._randomness, self._reseed, self._logger = randomness, reseed, logger

    def state_dict(self) -> dict[str, Any]:
        """Collective: every rank's RNG states, gathered on every rank."""
        randomness = dict(self._randomness())
        return dict(
            seed=randomness.get("seed"),
            randomness=randomness,
            rng_states=dist.all_gather_object(capture_rng_state()),
        )

    def local_state_dict(self) -> dict[str, Any]:
        """This rank's RNG state and the run's seed (no collective)."""
        randomness = dict(self._randomness())
        return dict(
            seed=randomness.get("seed"), randomness=randomness, rng_state=capture_rng_state()
        )

    def load_local_state_dict(self, state_dict: Mapping[str, Any]) -> None:
        """Restore what a peer rank's :meth:`local_state_dict` gave (no collective)."""
        seed, here = state_dict.get("seed"), self._randomness().get("seed")
        if seed is not None and seed != here:
            self._reseed(seed)
        restore_rng_state(state_dict["rng_state"])

    def load_state_dict(self, state_dict: Mapping[str, Any]) -> None:
        seed, here = state_dict.get("seed"), self._randomness().get("seed")
        if seed is not None and seed != here:
            self._logger.warning("The checkpoint's seed %s replaces this run's seed %s", seed, here)
            self._reseed(seed)
        states = state_dict.get("rng_states")
        rank, world_size = dist.get_rank(), dist.get_world_size()
        if states and len(states) == world_size:
            restore_rng_state(states[rank])
        elif states:
            self._logger.warning(
                "The checkpoint was saved on %d ranks and is resumed on %d: RNG states are not "
                "restored; every rank is reseeded from seed %s instead",
                len(states),
                world_size,
                self._randomness().get("seed"),
            )

"""A DataLoader's ``batch_sampler`` that gives this rank its share of each global batch, for the frameworks.

A framework builds its own :class:`~torch.utils.data.DataLoader` and decides when a step starts;
:class:`ShareBatchSampler` plugs into both. As the loader draws step ``s`` (step ``s`` of the epoch
uses positions ``[s*B, s*B + B)`` of the epoch's permutation:
:class:`~omnilearn.train.sampler.GlobalBatchSampler`), it splits the step by the controller's shares
of that moment and yields this rank's contiguous slice; every sample is used once per epoch and
every rank runs the same number of steps, whatever the shares. A loader may draw a few steps ahead
of the one being trained (worker processes, a framework's look-ahead): the split of each drawn
step is kept, and the loop's step hooks open and close the steps in order (:meth:`begin_step`,
:meth:`end_step`), so each step's gradient is weighted by the shares its samples were drawn with.
Every rank's loader draws the same number of steps ahead, so every rank splits each step alike.
A rank whose share of a partial last step is empty gets two of the step's samples as a stand-in
batch of weight 0 (:attr:`StepSession.weight <omnilearn.torch.session.StepSession.weight>`): the
framework's step runs as usual, and its gradient does not count.
"""

from __future__ import annotations

from collections import deque
from collections.abc import Callable, Iterator, Sized
from dataclasses import dataclass
from typing import Any

from torch.utils.data import (
    BatchSampler,
    DataLoader,
    DistributedSampler,
    IterableDataset,
    RandomSampler,
    SequentialSampler,
    default_collate,
)

from omnilearn.errors import UserError
from omnilearn.torch.session import StepSession
from omnilearn.train.sampler import GlobalBatchSampler


@dataclass(frozen=True)
class DrawnStep:
    """A step whose samples a loader has drawn: where it is, and every rank's share of it."""

    epoch: int
    step: int
    steps: int
    sizes: list[int]


class ShareBatchSampler:
    """This rank's indices of each global batch of ``dataset``; the steps of ``session``.

    ``len()`` is the number of steps per epoch (the same on every rank). Each iteration is one
    epoch: the next one, or the one given to :meth:`set_epoch`.
    """

    def __init__(self, session: StepSession, dataset: Sized, global_batch: int, *, seed: int = 0,
                 drop_last: bool = False, collate: Callable[[list[Any]], Any] | None = None) -> None:
        self.session = session
        self.dataset, self.collate = dataset, collate or default_collate
        self.dataset_size = len(dataset)
        self.global_batch = global_batch
        self.seed, self.drop_last = seed, drop_last
        self.data_name = type(dataset).__name__
        self._plain = GlobalBatchSampler(self.dataset_size, global_batch, seed, drop_last=drop_last)
        self._drawn: deque[DrawnStep] = deque()
        self._open: DrawnStep | None = None
        self._next_epoch = 0

    def __len__(self) -> int:
        return self._plain.steps_per_epoch

    def set_epoch(self, epoch: int) -> None:
        self._next_epoch = epoch

    def attach(self) -> GlobalBatchSampler:
        """The session's job, controller and sampler, built for this loader (once)."""
        return self.session.attach(self.dataset_size, self.global_batch, self.seed, self.drop_last,
                                   ("", self.data_name))

    def first(self, size: int) -> Any:
        """The first ``size`` samples of the dataset, collated as the loader's batches are (the start-up
        probe's batches)."""
        return self.collate([self.dataset[i % self.dataset_size] for i in range(size)])  # type: ignore[index]

    def __iter__(self) -> Iterator[list[int]]:
        sampler = self.attach()
        epoch, self._next_epoch = self._next_epoch, self._next_epoch + 1
        self._drawn.clear()  # steps drawn by an iteration the loop left early are never trained
        sampler.set_epoch(epoch)
        steps, rank = sampler.steps_per_epoch, self.session.rank
        for step in range(steps):
            sizes = sampler.step_sizes(step, self.session.batch_sizes)
            self._drawn.append(DrawnStep(epoch, step, steps, sizes))
            first = step * self.global_batch
            start = first + sum(sizes[:rank])
            mine = sampler.permutation[start:start + sizes[rank]].tolist()
            # An empty share (a partial last step) still runs the model, on a stand-in of two of the step's
            # samples: many models cannot take an empty batch, and BatchNorm no single sample. Its weight
            # b_i / B is 0, so the hook drops its gradient and every sample still counts once.
            yield mine or sampler.permutation[first:first + min(2, sampler.step_size(step))].tolist()

    # ---------------------------------------------------------------- the loop's step hooks
    def begin_step(self) -> list[int]:
        """The loop starts training the oldest drawn step; returns every rank's share of it."""
        if not self._drawn:
            raise UserError("a training step began with no batch drawn from omnilearn's batch sampler: the "
                            "training loader must be the one omnilearn built")
        self._open = self._drawn.popleft()
        o = self._open
        return self.session.begin_step(o.epoch, o.step, o.steps, sizes=o.sizes)

    def end_step(self) -> None:
        """After the step's optimizer step: record it, let the controller decide; an epoch's last ends it."""
        opened, self._open = self._open, None
        if opened is None:
            return
        if opened.step == opened.steps - 1:
            self.session.end_epoch(opened.epoch)
        else:
            self.session.finish_step()

    def close(self) -> None:
        """At the end of training: an epoch the loop cut short still gets its end record and summary."""
        if self.session.sampler is None:
            return
        self.end_step()
        if self.session.steps_done % len(self) != 0:
            self.session.end_epoch(self._next_epoch - 1)


_PLAIN_SAMPLERS = (SequentialSampler, RandomSampler, DistributedSampler)


def share_loader(loader: DataLoader, session: StepSession, global_batch: int | None, seed: int,
                 library: str) -> DataLoader:
    """``loader`` with :class:`ShareBatchSampler` instead of its sampler; the rest of its settings kept.

    ``global_batch``: by default the loader's ``batch_size`` times the number of ranks. A loader
    whose samples come from somewhere the global batch cannot reach (an iterable dataset, a sampler
    or batch sampler of the user's own) is a UserError: omnilearn's sampler decides which samples
    each step uses.
    """
    if isinstance(loader.dataset, IterableDataset) or not hasattr(loader.dataset, "__len__"):
        raise UserError(f"{library}: the training dataset must be map-style (__getitem__ and __len__), "
                        f"not {type(loader.dataset).__name__}")
    if type(loader.batch_sampler) is not BatchSampler or loader.batch_size is None:
        what = (f"its own batch_sampler ({type(loader.batch_sampler).__name__})" if loader.batch_sampler is not None
                else "batch_size=None")
        raise UserError(f"{library}: the training DataLoader has {what}; omnilearn's batch sampler gives each rank "
                        "its share of the global batch: give the DataLoader a batch_size")
    if type(loader.sampler) not in _PLAIN_SAMPLERS:  # exactly: Lightning wraps a user's own in a DistributedSampler
        own = getattr(getattr(loader.sampler, "dataset", None), "_sampler", loader.sampler)  # inside Lightning's wrapper
        raise UserError(f"{library}: the training DataLoader has its own sampler ({type(own).__name__}); "
                        "omnilearn's sampler decides the order (one seeded permutation per epoch): leave it out")
    batch = global_batch if global_batch is not None else loader.batch_size * session.world
    shares = ShareBatchSampler(session, loader.dataset, batch, seed=seed, drop_last=loader.drop_last,
                               collate=loader.collate_fn)
    workers = loader.num_workers
    return DataLoader(loader.dataset, batch_sampler=shares, collate_fn=loader.collate_fn,
                      num_workers=workers, pin_memory=loader.pin_memory, timeout=loader.timeout,
                      worker_init_fn=loader.worker_init_fn, multiprocessing_context=loader.multiprocessing_context,
                      generator=loader.generator, prefetch_factor=loader.prefetch_factor if workers else None,
                      persistent_workers=loader.persistent_workers if workers else False,
                      pin_memory_device=loader.pin_memory_device)

"""Lightning: whether training waits for data, logged with ``LightningModule.log``.

Lightning fetches each batch and moves it to the device before ``on_train_batch_start``;
the step runs until ``on_train_batch_end``. The time between the two hooks is the step;
the time from one step's end to the next step's start is the wait for data (the fetch
and Lightning's move to the device). Validation inside an epoch is work, not waiting.
"""

from __future__ import annotations

from collections.abc import Callable
from typing import Any

import lightning.pytorch as pl

from .._transfer.meter import InputStats, Timeline

__all__ = ["LightningInputMonitor"]


class LightningInputMonitor(pl.Callback):
    """Log whether training waits for data, with the LightningModule's own ``log``.

    Every ``log_every_n_steps`` batches the epoch so far, and at each epoch's end the
    epoch, under ``prefix``: ``input_bound`` (the share of the time spent waiting for
    a batch), ``batches_per_s``, ``samples_per_s``, ``batch_bytes_per_s``,
    ``waited_s`` and ``busy_s`` (:class:`~pincollate.InputStats`). Any logger the
    trainer has (TensorBoard, CSV, W&B) records them; ``prog_bar=True`` shows the
    input-bound share in Lightning's progress bar.

    Args:
        prefix: put before each figure's name.
        prog_bar: show the input-bound share in the progress bar.
        samples: how many samples a batch holds, where the default (the first
            tensor's length) does not fit.

    Example::

        trainer = lightning.Trainer(callbacks=[pincollate.LightningInputMonitor()])
        trainer.fit(model, loader)  # logs data/input_bound, data/batches_per_s, ...
    """

    def __init__(self, prefix: str = "data/", prog_bar: bool = False, samples: Callable[[Any], int] | None = None):
        super().__init__()
        self.prefix = prefix
        self.prog_bar = prog_bar
        self._timeline = Timeline(samples)

    @property
    def epoch(self) -> InputStats:
        """The figures of the current training epoch (the last one, between epochs)."""
        return self._timeline.epoch

    @property
    def total(self) -> InputStats:
        """The figures of every training epoch so far together."""
        return self._timeline.total

    def on_train_epoch_start(self, trainer: pl.Trainer, pl_module: pl.LightningModule) -> None:
        self._timeline.begin()

    def on_train_batch_start(
        self, trainer: pl.Trainer, pl_module: pl.LightningModule, batch: Any, batch_idx: int
    ) -> None:
        self._timeline.arrived(batch)

    def on_train_batch_end(
        self, trainer: pl.Trainer, pl_module: pl.LightningModule, outputs: Any, batch: Any, batch_idx: int
    ) -> None:
        self._timeline.worked()
        # Trainer(log_every_n_steps=...), set on the trainer at run time (not a declared attribute).
        if (batch_idx + 1) % getattr(trainer, "log_every_n_steps", 50) == 0:
            self._log(pl_module, on_step=True)
        elif self.prog_bar:
            pl_module.log(self.prefix + "input_bound", self.epoch.input_bound, prog_bar=True, on_step=True)

    def on_validation_end(self, trainer: pl.Trainer, pl_module: pl.LightningModule) -> None:
        self._timeline.worked()  # validation within the epoch: the loop's own work

    def on_train_epoch_end(self, trainer: pl.Trainer, pl_module: pl.LightningModule) -> None:
        self._log(pl_module, on_step=False)

    def _log(self, pl_module: pl.LightningModule, on_step: bool) -> None:
        figures = self.epoch.as_dict(self.prefix)
        key = self.prefix + "input_bound"
        share = figures.pop(key)
        # Each rank waits on its own loader; the epoch's figures are the ranks' mean.
        pl_module.log(key, share, prog_bar=self.prog_bar, on_step=on_step, on_epoch=not on_step, sync_dist=not on_step)
        pl_module.log_dict(figures, on_step=on_step, on_epoch=not on_step, sync_dist=not on_step)

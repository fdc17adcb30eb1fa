"""transformers: whether ``Trainer`` waits for data, in the logs it records and reports.

``Trainer`` fetches a step's batches (all of a gradient-accumulation step's at once)
before ``on_step_begin``; the step runs until ``on_step_end``, and logging,
evaluation and saving follow. So the time from the last of those to the next
``on_step_begin`` is the wait for data, and the rest is the loop's own work. The
hooks do not see the batch: samples and bytes are not counted.
"""

from __future__ import annotations

from typing import Any

import transformers

from .._transfer.meter import InputStats, Timeline

__all__ = ["TransformersInputMonitor"]

#: Logs of these kinds are about evaluation, not training: the figures stay out of them.
_NOT_TRAINING = ("eval_", "test_")


class TransformersInputMonitor(transformers.TrainerCallback):
    """Add whether training waits for data to ``Trainer``'s training logs.

    Each training log (every ``logging_steps``) gets the epoch so far under ``prefix``:
    ``input_bound`` (the share of the time spent waiting for a batch),
    ``batches_per_s``, ``waited_s`` and ``busy_s`` (:class:`~pincollate.InputStats`);
    the log at the end of training gets the whole run's. They land in
    ``trainer.state.log_history`` and the printed logs, and reach the reporting
    integrations (TensorBoard, W&B) that come after this callback in the trainer's
    list (``report_to``'s come first; move this one ahead of them with
    ``trainer.callback_handler.callbacks.insert(0, trainer.pop_callback(TransformersInputMonitor))``).

    Args:
        prefix: put before each figure's name.

    Example::

        trainer = transformers.Trainer(..., callbacks=[pincollate.TransformersInputMonitor()])
        trainer.train()
        trainer.state.log_history[-1]["data/input_bound"]
    """

    def __init__(self, prefix: str = "data/"):
        self.prefix = prefix
        self._timeline = Timeline()

    @property
    def epoch(self) -> InputStats:
        """The figures of the current training epoch (the last one, between epochs)."""
        return self._timeline.epoch

    @property
    def total(self) -> InputStats:
        """The figures of every training epoch so far together."""
        return self._timeline.total

    def on_epoch_begin(self, args: Any, state: Any, control: Any, **kwargs: Any) -> None:
        self._timeline.begin()

    def on_step_begin(self, args: Any, state: Any, control: Any, **kwargs: Any) -> None:
        self._timeline.arrived(batches=0)  # the step's batches are counted as each is used

    def on_substep_end(self, args: Any, state: Any, control: Any, **kwargs: Any) -> None:
        self._timeline.count(1)

    def on_step_end(self, args: Any, state: Any, control: Any, **kwargs: Any) -> None:
        self._timeline.count(1)
        self._timeline.worked()

    def on_evaluate(self, args: Any, state: Any, control: Any, **kwargs: Any) -> None:
        self._timeline.worked()

    def on_save(self, args: Any, state: Any, control: Any, **kwargs: Any) -> None:
        self._timeline.worked()

    def on_log(self, args: Any, state: Any, control: Any, logs: dict[str, float] | None = None, **kwargs: Any) -> None:
        self._timeline.worked()
        if logs is None or any(key.startswith(_NOT_TRAINING) for key in logs):
            return
        stats = self.total if "train_runtime" in logs else self.epoch  # the end of training: the run
        figures = stats.as_dict(self.prefix)
        logs.update(figures)
        # Trainer recorded a copy of these logs just before this hook: the figures join it.
        if state.log_history and state.log_history[-1].get("step") == state.global_step:
            state.log_history[-1].update(figures)

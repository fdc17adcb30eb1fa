"""Lightning: Trainer.fit with mm_collate batches, moved by Lightning's own transfer_batch_to_device."""

from __future__ import annotations

import csv
import time

import pytest
import torch
from torch.utils.data import DataLoader, default_collate

from pincollate import Batch, mm_collate
from samples import assert_same

L = pytest.importorskip("lightning.pytorch")

# Lightning's own notices (its pytree use, worker-count hints), not about the batches.
pytestmark = [
    pytest.mark.slow,
    pytest.mark.filterwarnings("ignore:.*LeafSpec.*:FutureWarning"),
    pytest.mark.filterwarnings("ignore::UserWarning:lightning.*"),
    pytest.mark.filterwarnings("ignore::DeprecationWarning"),
]


class _Records(torch.utils.data.Dataset):
    def __len__(self) -> int:
        return 16

    def __getitem__(self, i: int) -> dict:
        g = torch.Generator().manual_seed(i)
        return {"x": torch.randn(8, generator=g), "y": float(i % 2), "name": f"r{i}"}


class _Model(L.LightningModule):
    def __init__(self) -> None:
        super().__init__()
        self.layer = torch.nn.Linear(8, 1)
        self.seen: list[Batch] = []

    def training_step(self, batch, batch_idx):
        self.seen.append(batch)
        out = self.layer(batch["x"]).squeeze(1)
        return torch.nn.functional.mse_loss(out, batch["y"].float())

    def configure_optimizers(self):
        return torch.optim.SGD(self.parameters(), lr=0.1)


@pytest.mark.parametrize("workers", [0, 2])
def test_trainer_fit_sees_default_collate_values(workers):
    model = _Model()
    trainer = L.Trainer(
        max_epochs=1,
        accelerator="cpu",
        logger=False,
        enable_checkpointing=False,
        enable_progress_bar=False,
        enable_model_summary=False,
    )
    loader = DataLoader(_Records(), batch_size=4, collate_fn=mm_collate, num_workers=workers)
    trainer.fit(model, loader)
    assert len(model.seen) == 4
    reference = list(DataLoader(_Records(), batch_size=4))
    for ours, theirs in zip(model.seen, reference, strict=True):
        assert_same(dict(ours), theirs)
    moved = model.transfer_batch_to_device(model.seen[0], torch.device("cpu"), 0)
    assert isinstance(moved, Batch) and moved.layout is not None
    assert_same(dict(moved), default_collate([_Records()[i] for i in range(4)]))


class _Data(L.LightningDataModule):
    def train_dataloader(self):
        return DataLoader(_Records(), batch_size=4, collate_fn=mm_collate)

    def val_dataloader(self):
        return DataLoader(_Records(), batch_size=8, collate_fn=mm_collate)

    def predict_dataloader(self):
        return DataLoader(_Records(), batch_size=8, collate_fn=mm_collate)


class _Full(_Model):
    def validation_step(self, batch, batch_idx):
        self.log("val_loss", torch.nn.functional.mse_loss(self.layer(batch["x"]).squeeze(1), batch["y"].float()))

    def predict_step(self, batch, batch_idx):
        return batch["name"], self.layer(batch["x"]).squeeze(1)


def test_datamodule_validate_predict_and_bf16():
    trainer = L.Trainer(
        max_epochs=1,
        accelerator="cpu",
        precision="bf16-mixed",
        logger=False,
        enable_checkpointing=False,
        enable_progress_bar=False,
        enable_model_summary=False,
    )
    model, data = _Full(), _Data()
    trainer.fit(model, datamodule=data)
    (metrics,) = trainer.validate(model, datamodule=data, verbose=False)
    assert torch.isfinite(torch.tensor(metrics["val_loss"]))
    predictions = trainer.predict(model, datamodule=data)
    assert [names for names, _ in predictions] == [[f"r{i}" for i in range(8)], [f"r{i}" for i in range(8, 16)]]


# --- LightningInputMonitor: whether training waits for data, in Lightning's own logs ---------

#: A sleep long against a tiny model's step on CPU; the shares are compared with 0.3 and 0.7.
NAP = 0.03


class _SlowRecords(_Records):
    def __init__(self, nap: float = 0.0):
        self.nap = nap

    def __getitem__(self, i: int) -> dict:
        if self.nap:
            time.sleep(self.nap / 4)  # a batch of 4: one nap a batch
        return super().__getitem__(i)


class _SlowModel(_Model):
    def __init__(self, nap: float = 0.0):
        super().__init__()
        self.nap = nap

    def training_step(self, batch, batch_idx):
        if self.nap:
            time.sleep(self.nap)
        return super().training_step(batch, batch_idx)


@pytest.mark.parametrize("slow", ["data", "model"])
def test_input_monitor_logs_the_input_bound_share_through_the_logger(tmp_path, slow):
    import pincollate

    monitor = pincollate.LightningInputMonitor(prog_bar=True)
    trainer = L.Trainer(
        max_epochs=2,
        accelerator="cpu",
        logger=L.loggers.CSVLogger(tmp_path),
        log_every_n_steps=2,
        callbacks=[monitor],
        enable_checkpointing=False,
        enable_progress_bar=False,
        enable_model_summary=False,
    )
    loader = DataLoader(_SlowRecords(NAP if slow == "data" else 0.0), batch_size=4, collate_fn=mm_collate)
    trainer.fit(_SlowModel(NAP if slow == "model" else 0.0), loader)
    epoch = monitor.epoch
    assert (epoch.batches, epoch.samples, monitor.total.batches) == (4, 16, 8)
    assert epoch.input_bound > 0.7 if slow == "data" else epoch.input_bound < 0.3, epoch
    assert trainer.callback_metrics["data/input_bound"].item() == pytest.approx(epoch.input_bound)
    with open(trainer.logger.experiment.metrics_file_path) as f:
        rows = list(csv.DictReader(f))
    shares = [float(row["data/input_bound"]) for row in rows if row.get("data/input_bound")]
    # Every second step and each epoch's end, both epochs.
    assert len(shares) == 6 and all(share > 0.7 if slow == "data" else share < 0.3 for share in shares), shares
    assert {"data/batches_per_s", "data/samples_per_s", "data/batch_bytes_per_s", "data/waited_s"} <= set(rows[0])


def test_input_monitor_counts_validation_as_work(tmp_path):
    import pincollate

    class SlowValidation(_Full):
        def validation_step(self, batch, batch_idx):
            time.sleep(NAP)
            return super().validation_step(batch, batch_idx)

    monitor = pincollate.LightningInputMonitor()
    trainer = L.Trainer(
        max_epochs=1,
        accelerator="cpu",
        logger=False,
        val_check_interval=2,
        num_sanity_val_steps=0,
        callbacks=[monitor],
        enable_checkpointing=False,
        enable_progress_bar=False,
        enable_model_summary=False,
    )
    trainer.fit(SlowValidation(), datamodule=_Data())
    # Two validation runs of two slow batches inside the epoch; the data itself is quick.
    assert monitor.epoch.batches == 4 and monitor.epoch.input_bound < 0.3, monitor.epoch

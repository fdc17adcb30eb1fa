"""Hugging Face: transformers Trainer with a tiny model from a config, datasets formats, accelerate."""

from __future__ import annotations

import time

import pytest
import torch
from torch.utils.data import DataLoader

from pincollate import Batch, MMCollate, Pad, to_device
from samples import assert_one_buffer

pytestmark = [
    pytest.mark.slow,
    pytest.mark.filterwarnings("ignore::DeprecationWarning"),
    pytest.mark.filterwarnings("ignore::FutureWarning"),
]

#: The Hugging Face conventions: ids padded with a mask named as models expect, no
#: lengths, and datasets' "label" column renamed to the "labels" models take.
HF = MMCollate(fields={"input_ids": Pad(mask_key="attention_mask", lengths_key=None)}, rename={"label": "labels"})


def _texts(n: int = 16) -> list[dict]:
    g = torch.Generator().manual_seed(0)
    return [
        {
            "input_ids": torch.randint(5, 90, (int(torch.randint(3, 12, (), generator=g)),), generator=g).tolist(),
            "label": i % 2,
        }
        for i in range(n)
    ]


@pytest.mark.parametrize("arch", ["bert", "gpt2"])
def test_transformers_trainer_trains_a_tiny_model(tmp_path, arch):
    transformers = pytest.importorskip("transformers")
    if arch == "bert":
        config = transformers.BertConfig(
            vocab_size=100,
            hidden_size=16,
            num_hidden_layers=1,
            num_attention_heads=2,
            intermediate_size=32,
            num_labels=2,
        )
        model = transformers.BertForSequenceClassification(config)
    else:
        config = transformers.GPT2Config(
            vocab_size=100, n_embd=16, n_layer=1, n_head=2, n_positions=32, num_labels=2, pad_token_id=0
        )
        model = transformers.GPT2ForSequenceClassification(config)
    args = transformers.TrainingArguments(
        output_dir=str(tmp_path),
        max_steps=3,
        per_device_train_batch_size=4,
        report_to=[],
        use_cpu=True,
        save_strategy="no",
        logging_steps=1,
        disable_tqdm=True,
    )
    trainer = transformers.Trainer(model=model, args=args, train_dataset=_texts(), data_collator=HF)
    result = trainer.train()
    assert result.global_step == 3 and torch.isfinite(torch.tensor(result.training_loss))
    batch = HF(_texts(4))
    assert list(batch) == ["input_ids", "attention_mask", "labels"]
    assert batch["attention_mask"].sum(1).tolist() == [len(s["input_ids"]) for s in _texts(4)]
    assert_one_buffer(batch)


def test_datasets_python_lists_torch_format_and_iterable():
    datasets = pytest.importorskip("datasets")
    rows = _texts(8)
    ds = datasets.Dataset.from_list(rows)
    plain = list(DataLoader(ds, batch_size=4, collate_fn=HF))
    torch_format = list(DataLoader(ds.with_format("torch"), batch_size=4, collate_fn=HF))
    streamed = list(DataLoader(ds.to_iterable_dataset(), batch_size=4, collate_fn=HF))
    for a, b, c in zip(plain, torch_format, streamed, strict=True):
        assert torch.equal(a["input_ids"], b["input_ids"]) and torch.equal(a["input_ids"], c["input_ids"])
        assert torch.equal(a["labels"], b["labels"])
    first = [len(r["input_ids"]) for r in rows[:4]]
    assert plain[0]["attention_mask"].sum(1).tolist() == first


def test_datasets_arrow_format_batches_collate_from_arrows_buffers():
    # A datasets table in arrow format, read a batch of rows at a time (a batch sampler, no
    # per-sample collate): ColumnCollate reads the token id lists from Arrow in one piece.
    datasets = pytest.importorskip("datasets")
    from torch.utils.data import BatchSampler, SequentialSampler

    import pincollate

    ids = [[1, 2, 3], [4], [5, 6], [7, 8, 9, 10], [11]]
    ds = datasets.Dataset.from_dict({"input_ids": ids, "label": [0, 1, 0, 1, 1]}).with_format("arrow")
    collate = pincollate.ColumnCollate(fields={"input_ids": Pad(mask_key="attention_mask")})
    sampler = BatchSampler(SequentialSampler(range(len(ds))), batch_size=2, drop_last=False)
    batches = list(DataLoader(ds, batch_size=None, sampler=sampler, collate_fn=collate))
    assert [type(b) for b in batches] == [Batch] * 3
    assert batches[1]["input_ids"].tolist() == [[5, 6, 0, 0], [7, 8, 9, 10]]
    assert batches[1]["attention_mask"].sum(1).tolist() == [2, 4] and batches[2]["label"].tolist() == [1]
    for batch in batches:
        assert_one_buffer(batch)


def _tokenized(pad_id: int = 3) -> tuple[object, object]:
    """A word-level tokenizer built offline (pad id ``pad_id``), and a dataset it tokenized as ``dataset.map`` does."""
    datasets = pytest.importorskip("datasets")
    transformers = pytest.importorskip("transformers")
    from tokenizers import Tokenizer, pre_tokenizers
    from tokenizers.models import WordLevel

    vocab = {"[UNK]": 0, "[PAD]": pad_id, **{f"w{i}": i + 4 for i in range(20)}}
    words = Tokenizer(WordLevel(vocab, unk_token="[UNK]"))
    words.pre_tokenizer = pre_tokenizers.Whitespace()
    tokenizer = transformers.PreTrainedTokenizerFast(
        tokenizer_object=words,
        pad_token="[PAD]",
        unk_token="[UNK]",
        model_input_names=["input_ids", "token_type_ids", "attention_mask"],
    )
    texts = ["w1 w2 w3", "w4 w5", "w6", "w7 w8 w9 w10", "w11 w12", "w13"]
    ds = datasets.Dataset.from_dict({"text": texts, "label": [0, 1, 0, 1, 1, 0]})
    ds = ds.map(lambda rows: tokenizer(rows["text"]), batched=True, remove_columns=["text"])
    return tokenizer, ds


def _documented_recipe(tokenizer: object) -> dict:
    # docs/integrations.md: a tokenizer's own output, its mask and token types padded beside the ids.
    return {
        "ragged": Pad(mask_key=None, lengths_key=None),
        "fields": {"input_ids": Pad(value=tokenizer.pad_token_id, mask_key=None, lengths_key=None)},  # type: ignore[attr-defined]
        "rename": {"label": "labels"},
    }


def test_a_tokenizers_own_output_collates_as_data_collator_with_padding_and_a_model_takes_it():
    transformers = pytest.importorskip("transformers")
    tokenizer, ds = _tokenized()
    collate = MMCollate(**_documented_recipe(tokenizer))
    reference = transformers.DataCollatorWithPadding(tokenizer)
    config = transformers.BertConfig(
        vocab_size=24, hidden_size=8, num_hidden_layers=1, num_attention_heads=2, intermediate_size=16, num_labels=2
    )
    model = transformers.BertForSequenceClassification(config)
    for source in (ds, ds.with_format("torch")):
        batches = DataLoader(source, batch_size=4, collate_fn=collate)
        for batch, rows in zip(batches, ([0, 1, 2, 3], [4, 5]), strict=True):
            want = reference([ds[i] for i in rows])
            assert sorted(batch) == sorted(want)
            for key in want:
                assert batch[key].dtype == want[key].dtype and torch.equal(batch[key], want[key]), key
            padded = batch["input_ids"] == tokenizer.pad_token_id  # type: ignore[attr-defined]
            assert torch.equal(padded, batch["attention_mask"] == 0) and padded.any()
            assert torch.isfinite(model(**batch).loss)


def test_an_integer_mask_from_pad_equals_data_collator_with_paddings_and_xlnet_takes_it():
    # docs/integrations.md: XLNet subtracts from its mask; Pad(mask_dtype=torch.int64) gives it the tokenizer's 1/0 mask.
    transformers = pytest.importorskip("transformers")
    tokenizer, ds = _tokenized()
    ds = ds.remove_columns(["attention_mask", "token_type_ids"])  # ids alone: the collate makes the mask
    pad = Pad(value=tokenizer.pad_token_id, mask_key="attention_mask", lengths_key=None, mask_dtype=torch.int64)  # type: ignore[attr-defined]
    collate = MMCollate(fields={"input_ids": pad}, rename={"label": "labels"})
    reference = transformers.DataCollatorWithPadding(tokenizer)
    config = transformers.XLNetConfig(vocab_size=24, d_model=8, n_layer=1, n_head=2, d_inner=16, num_labels=2)
    model = transformers.XLNetForSequenceClassification(config).eval()
    for _ in range(2):  # walked, then planned and compiled
        for batch, rows in zip(DataLoader(ds, batch_size=4, collate_fn=collate), ([0, 1, 2, 3], [4, 5]), strict=True):
            want = reference([ds[i] for i in rows])
            assert sorted(batch) == sorted(want) == ["attention_mask", "input_ids", "labels"]
            for key in want:
                assert batch[key].dtype == want[key].dtype and torch.equal(batch[key], want[key]), key
            with torch.no_grad():
                assert torch.equal(model(**batch).logits, model(**want).logits)
    with pytest.raises((TypeError, NotImplementedError), match="bool tensor"):  # why: XLNet cannot take a bool mask
        model(**MMCollate(fields={"input_ids": Pad(mask_key="attention_mask")})([ds[0], ds[1]]))


def test_arrow_token_columns_keep_their_types_and_a_cast_column_gives_int64():
    # docs/integrations.md: ColumnCollate keeps Arrow's int32 ids and int8 token types; a cast on
    # the dataset gives the int64 an embedding takes.
    datasets = pytest.importorskip("datasets")
    from torch.utils.data import BatchSampler, SequentialSampler

    import pincollate

    tokenizer, ds = _tokenized()
    collate = pincollate.ColumnCollate(**_documented_recipe(tokenizer))
    sampler = BatchSampler(SequentialSampler(range(len(ds))), batch_size=4, drop_last=False)
    (batch, _) = DataLoader(ds.with_format("arrow"), batch_size=None, sampler=sampler, collate_fn=collate)
    assert (batch["input_ids"].dtype, batch["token_type_ids"].dtype) == (torch.int32, torch.int8)
    cast = ds.cast_column("token_type_ids", datasets.Sequence(datasets.Value("int64")))
    (batch, _) = DataLoader(cast.with_format("arrow"), batch_size=None, sampler=sampler, collate_fn=collate)
    want = MMCollate(**_documented_recipe(tokenizer))([ds[i] for i in range(4)])
    assert batch["token_type_ids"].dtype == torch.int64
    for key in want:
        assert torch.equal(batch[key].long(), want[key].long()), key


def test_datasets_image_features_come_back_as_pil_and_stack():
    datasets = pytest.importorskip("datasets")
    from PIL import Image

    images = [Image.new("RGB", (8, 6), color=(i * 30, 0, 0)) for i in range(4)]
    ds = datasets.Dataset.from_dict({"image": images, "label": [0, 1, 0, 1]}).cast_column("image", datasets.Image())
    batch = next(iter(DataLoader(ds, batch_size=4, collate_fn=MMCollate(rename={"label": "labels"}))))
    assert batch["image"].shape == (4, 3, 6, 8) and batch["image"][2, 0, 0, 0].item() == 60
    assert batch["labels"].tolist() == [0, 1, 0, 1]


def test_accelerate_prepare_and_send_to_device():
    accelerate = pytest.importorskip("accelerate")
    accelerator = accelerate.Accelerator(cpu=True)
    loader = accelerator.prepare(DataLoader(_texts(8), batch_size=4, collate_fn=HF))
    batches = list(loader)
    assert len(batches) == 2 and all(isinstance(b, Batch) for b in batches)
    assert batches[0]["input_ids"].device.type == "cpu"
    from accelerate.utils import send_to_device

    # send_to_device moves an object with its own .to() whole; skip_keys reach a plain dict.
    moved = send_to_device(dict(batches[0]), "cpu", skip_keys=["labels"])
    assert moved["labels"] is batches[0]["labels"]
    assert to_device(batches[0], "cpu") is batches[0]


def test_datasets_numpy_format_stacks_like_torch_format():
    datasets = pytest.importorskip("datasets")
    ds = datasets.Dataset.from_dict({"x": [[float(i), float(i + 1)] for i in range(8)], "label": list(range(8))})
    as_numpy = next(iter(DataLoader(ds.with_format("numpy"), batch_size=4, collate_fn=HF)))
    as_torch = next(iter(DataLoader(ds.with_format("torch"), batch_size=4, collate_fn=HF)))
    assert torch.equal(as_numpy["x"].to(as_torch["x"].dtype), as_torch["x"]) and as_numpy["labels"].tolist() == [
        0,
        1,
        2,
        3,
    ]


# --- TransformersInputMonitor: whether Trainer waits for data, in its logs ---------------------

#: A sleep long against a tiny model's step under Trainer on a busy CPU (30-100 ms); the shares are
#: compared with 0.3 and 0.7. The first epoch's first step (warming up) is slower still: the second
#: epoch is the one judged.
NAP = 0.3


class _SlowTexts(torch.utils.data.Dataset):
    def __init__(self, nap: float):
        self.rows, self.nap = _texts(), nap

    def __len__(self) -> int:
        return len(self.rows)

    def __getitem__(self, i: int) -> dict:
        time.sleep(self.nap / 4)  # a batch of 4: one nap a batch
        return self.rows[i]


@pytest.mark.parametrize("slow", ["data", "model"])
def test_input_monitor_adds_the_input_bound_share_to_the_trainers_logs(tmp_path, slow):
    transformers = pytest.importorskip("transformers")
    import pincollate

    config = transformers.BertConfig(
        vocab_size=100, hidden_size=16, num_hidden_layers=1, num_attention_heads=2, intermediate_size=32, num_labels=2
    )
    model = transformers.BertForSequenceClassification(config)
    if slow == "model":
        model.register_forward_pre_hook(lambda module, args: time.sleep(NAP))
    args = transformers.TrainingArguments(
        output_dir=str(tmp_path),
        num_train_epochs=2,
        per_device_train_batch_size=4,
        report_to=[],
        use_cpu=True,
        save_strategy="no",
        logging_steps=2,
        disable_tqdm=True,
    )
    monitor = pincollate.TransformersInputMonitor()
    data = _SlowTexts(NAP if slow == "data" else 0.0)
    trainer = transformers.Trainer(model=model, args=args, train_dataset=data, data_collator=HF, callbacks=[monitor])
    trainer.train()
    assert (monitor.epoch.batches, monitor.total.batches) == (4, 8)
    share, epoch = monitor.epoch.input_bound, monitor.epoch
    # Every nap lands on its side, whatever else runs on the machine (a BERT step on a busy
    # machine can take as long as a nap, so the share alone would say little).
    if slow == "data":
        assert epoch.waited_s >= 0.95 * 4 * NAP, epoch
    else:
        assert epoch.busy_s >= 0.95 * 4 * NAP and epoch.waited_s < 0.5 * 4 * NAP, epoch
    logged = [entry for entry in trainer.state.log_history if "data/input_bound" in entry]
    # Every second step of both epochs, and the end of training with the whole run's.
    assert len(logged) == 5 and "train_runtime" in logged[-1] and "loss" in logged[0]
    assert logged[-1]["data/input_bound"] == pytest.approx(monitor.total.input_bound, abs=0.05)
    assert logged[-2]["data/input_bound"] == pytest.approx(share, abs=0.05)  # the second epoch at its end


def test_input_monitor_keeps_evaluation_out_of_the_figures_and_the_eval_logs(tmp_path):
    transformers = pytest.importorskip("transformers")
    import pincollate

    config = transformers.BertConfig(
        vocab_size=100, hidden_size=16, num_hidden_layers=1, num_attention_heads=2, intermediate_size=32, num_labels=2
    )
    args = transformers.TrainingArguments(
        output_dir=str(tmp_path),
        max_steps=4,
        per_device_train_batch_size=4,
        per_device_eval_batch_size=4,
        eval_strategy="steps",
        eval_steps=2,
        report_to=[],
        use_cpu=True,
        save_strategy="no",
        disable_tqdm=True,
    )
    monitor = pincollate.TransformersInputMonitor()
    trainer = transformers.Trainer(
        model=transformers.BertForSequenceClassification(config),
        args=args,
        train_dataset=_texts(),
        eval_dataset=_SlowTexts(NAP / 4),  # slow evaluation: work between steps, not waiting for training data
        data_collator=HF,
        callbacks=[monitor],
    )
    trainer.train()
    evaluations = [entry for entry in trainer.state.log_history if "eval_loss" in entry]
    assert len(evaluations) == 2 and not any("data/input_bound" in entry for entry in evaluations)
    assert monitor.total.batches == 4 and monitor.total.input_bound < 0.3, monitor.total

"""A lifetime fuzzer: a seeded random program that holds batches the way users do.

At every step the program takes a batch from a DataLoader and, at random, keeps it,
slices it, views it as numpy, as a memoryview or through DLPack, keeps a storage,
writes into it, sends it (or a leaf) to a consumer process, forks a child that keeps
everything it inherited, calls ``share_memory_``, collects garbage and drops things.
The collate_fn, in the workers, returns extra tensors beside some batches and keeps
views of others for a while. Every value still held is compared with a copy taken
when it was handed out, in every process that holds it: the main process, the
consumer, each fork child and each worker. Writes the program makes update the copy
(and a batch that another process shares is written no more).

A bounded run is part of the suite (``tests/test_lifetime.py``); a long one, for
before a release::

    python tests/lifetime.py --steps 100000 --seed 7      # make fuzz

Every failure names the seed, the configuration and the step, which reproduce it.
"""

from __future__ import annotations

import argparse
import contextlib
import dataclasses
import gc
import os
import queue as queues
import random
import select
import sys
import time
import warnings
from collections.abc import Callable, Iterator
from multiprocessing import resource_sharer
from typing import Any

import numpy as np
import torch
import torch.multiprocessing as tmp
from torch.utils.data import DataLoader, Dataset, get_worker_info

from pincollate import MMCollate, Pad


@dataclasses.dataclass(frozen=True)
class Config:
    """One way of running the program: workers, ring on or off, how processes start."""

    workers: int
    slots: int  # worker_slots: 0 turns the ring off
    context: str  # "fork" or "spawn", for the workers and the consumer

    def __str__(self) -> str:
        ring = "ring" if self.slots else "no ring"
        return f"{self.workers} workers, {ring}, {self.context}" if self.workers else f"main process, {self.context}"


CONFIGS = (
    Config(0, 8, "fork"),
    Config(2, 8, "fork"),
    Config(2, 0, "fork"),
    Config(2, 8, "spawn"),
    Config(2, 0, "spawn"),
)


class FuzzError(AssertionError):
    pass


# --- the data and the collate_fn ---------------------------------------------------------------


class Samples(Dataset):
    """Sample ``(id, length)``: ``x`` is ``length`` copies of ``id``; ``y`` three ids; a tag."""

    def __len__(self) -> int:
        raise TypeError("indexed by (id, length) through a batch sampler")

    def __getitem__(self, index: tuple[int, int]) -> dict[str, Any]:
        sample_id, length = index
        return {
            "x": torch.full((length,), float(sample_id)),
            "y": torch.tensor([sample_id, -sample_id, 7]),
            "i": sample_id,
            "tag": f"s{sample_id}",
        }


def batches(seed: int, steps: int, big: float) -> list[list[tuple[int, int]]]:
    """The batch sampler: ``steps`` batches of 1-6 samples, a share ``big`` of about 1 MiB or more."""
    rng = random.Random(seed)
    out, next_id = [], 0
    for _ in range(steps):
        size = rng.randint(1, 6)
        longest = 70_000 if rng.random() < big else 3000
        out.append([(next_id + k, rng.randint(1, longest)) for k in range(size)])
        next_id += size
    return out


def _bytes(t: torch.Tensor) -> np.ndarray:
    return t.detach().contiguous().numpy().view(np.uint8).reshape(-1)


def _offsets(batch: Any) -> dict[str, int]:
    """Where each field of a fresh batch lies in its buffer (each has a storage of its own)."""
    buffer = batch.buffer
    if buffer is None:
        raise FuzzError("a batch lost its layout although nothing changed it")
    base = buffer.data_ptr()
    return {key: t.data_ptr() - base for key, t in batch.items() if isinstance(t, torch.Tensor) and t.numel()}


def _batch_bytes(batch: Any, offsets: dict[str, int], nbytes: int) -> np.ndarray:
    """What a batch's fields read, each at its offset in the buffer it came in (gaps zero)."""
    out = np.zeros(nbytes, dtype=np.uint8)
    for key, at in offsets.items():
        data = _bytes(batch[key])
        out[at : at + data.size] = data
    return out


_kept_in_worker: list[tuple[Callable[[], np.ndarray], np.ndarray, str]] = []


class FuzzCollate:
    """``mm_collate`` that returns ``(batch, extras)``, and keeps views of some batches in a worker."""

    def __init__(self, seed: int, slots: int):
        self.seed = seed
        self.collate = MMCollate(pin_memory=False, fields={"x": Pad()}, worker_slots=slots)

    def __call__(self, samples: list[dict[str, Any]]) -> tuple[Any, list[torch.Tensor], bool]:
        first = int(samples[0]["i"])
        rng = random.Random(self.seed * 1_000_003 + first)
        for read, expected, what in list(_kept_in_worker):
            if not np.array_equal(read(), expected):
                raise FuzzError(f"in worker {os.getpid()}: {what} changed (seed {self.seed}, batch of sample {first})")
        _kept_in_worker[:] = [entry for entry in _kept_in_worker if rng.random() > 0.2]
        batch = self.collate(samples)
        # In a worker only: in the main process the program writes into batches these would view.
        viewed = get_worker_info() is not None and rng.random() < 0.2
        if viewed:
            kind = rng.choice(["numpy", "storage", "slice"])
            if kind == "numpy":
                array = batch["x"].numpy()
                read: Callable[[], np.ndarray] = lambda a=array: a.view(np.uint8).reshape(-1)  # noqa: E731
            elif kind == "storage":
                storage = batch["x"].untyped_storage()
                read = lambda s=storage: torch.empty(0, dtype=torch.uint8).set_(s).numpy()  # noqa: E731
            else:
                rows = batch["x"][rng.randint(0, batch["x"].shape[0] - 1) :]
                read = lambda r=rows: _bytes(r)  # noqa: E731
            _kept_in_worker.append((read, read().copy(), f"a {kind} of the batch of sample {first}"))
        extras = []
        if rng.random() < 0.25:
            extras = [batch["x"][0], batch["y"][-1:]]
        # A worker's view shares memory with the batch the main process gets (as with
        # default_collate): the program does not write into such a batch.
        return batch, extras, viewed


# --- the consumer process ------------------------------------------------------------------------


def _read_sent(obj: Any, offsets: dict[str, int] | None, nbytes: int) -> np.ndarray:
    return _bytes(obj) if offsets is None else _batch_bytes(obj, offsets, nbytes)


def consumer(inbox: Any, outbox: Any) -> None:
    """Keeps what it is sent and checks all of it whenever asked."""
    kept: dict[int, tuple[Any, np.ndarray, dict[str, int] | None]] = {}
    bad: list[str] = []
    while True:
        message = inbox.get()
        if message[0] == "keep":
            _, key, obj, expected, offsets = message
            kept[key] = (obj, expected, offsets)
            if not np.array_equal(_read_sent(obj, offsets, expected.size), expected):
                bad.append(f"item {key} arrived changed")
        elif message[0] == "drop":
            kept.pop(message[1], None)
        else:
            for key, (obj, expected, offsets) in kept.items():
                if not np.array_equal(_read_sent(obj, offsets, expected.size), expected):
                    bad.append(f"item {key} changed in the consumer")
            outbox.put(list(bad))
            if message[0] == "stop":
                return


# --- the main program ------------------------------------------------------------------------------


@dataclasses.dataclass
class Group:
    """One handed-out batch (or one extra tensor): the bytes it held when handed out."""

    name: str
    expected: np.ndarray
    frozen: bool = False  # shared with another process, or moved: no more writes
    offsets: dict[str, int] = dataclasses.field(default_factory=dict)  # a batch's fields in its buffer


@dataclasses.dataclass
class Holder:
    """Something the program keeps that reads bytes ``start:stop`` of a group."""

    kind: str
    obj: Any
    read: Callable[[], np.ndarray]
    group: Group
    start: int
    stop: int
    due: float

    def check(self, where: str) -> None:
        if not np.array_equal(self.read(), self.group.expected[self.start : self.stop]):
            raise FuzzError(f"{where}: a kept {self.kind} of {self.group.name} changed")


def _truth(batch: Any, samples: list[tuple[int, int]], extras: list[torch.Tensor]) -> None:
    """The batch as handed out holds exactly its samples."""
    ids = [sample_id for sample_id, _ in samples]
    lengths = [length for _, length in samples]
    if batch["i"].tolist() != ids or batch["tag"] != [f"s{i}" for i in ids] or batch["x_lengths"].tolist() != lengths:
        raise FuzzError(f"batch of samples {ids} arrived wrong")
    x = batch["x"]
    real = torch.arange(x.shape[1]) < torch.tensor(lengths)[:, None]
    if not torch.equal(x, torch.where(real, torch.tensor(ids, dtype=torch.float32)[:, None], torch.zeros(()))):
        raise FuzzError(f"batch of samples {ids}: x arrived wrong")
    if extras and not (torch.equal(extras[0], x[0]) and torch.equal(extras[1], batch["y"][-1:])):
        raise FuzzError(f"batch of samples {ids}: the tensors returned beside it arrived wrong")


class Program:
    """The random program over one loader: what it holds, in which processes."""

    def __init__(self, config: Config, seed: int, steps: int):
        self.config, self.seed, self.steps = config, seed, steps
        self.rng = random.Random(seed)
        self.holders: list[Holder] = []
        self.children: list[tuple[int, int, int, int]] = []  # pid, go fd, answer fd, due step
        self.sent: dict[int, int] = {}  # key -> due step, kept by the consumer
        self.step = 0
        self.forever = 0  # holders kept to the end of the run
        self.sampler = batches(seed, steps, 0.08 if config.workers == 0 else 0.01)
        self.counts: dict[str, int] = {}
        context = tmp.get_context(config.context)
        self.inbox, self.outbox = context.Queue(), context.Queue()
        self.consumer = context.Process(target=consumer, args=(self.inbox, self.outbox), daemon=True)

    def where(self) -> str:
        return f"seed {self.seed}, {self.config}, step {self.step}"

    def count(self, what: str) -> None:
        self.counts[what] = self.counts.get(what, 0) + 1

    def loader(self) -> DataLoader:
        kwargs: dict[str, Any] = {}
        if self.config.workers:
            kwargs = {"multiprocessing_context": self.config.context, "timeout": 120}
        return DataLoader(
            Samples(),
            batch_sampler=self.sampler,
            collate_fn=FuzzCollate(self.seed, self.config.slots),
            num_workers=self.config.workers,
            **kwargs,
        )

    def run(self) -> dict[str, int]:
        self.consumer.start()
        try:
            for step, (batch, extras, viewed) in enumerate(self.loader()):
                self.step = step
                _truth(batch, self.sampler[step], extras)
                self.take(batch, extras, viewed)
                del batch, extras
                self.act()
                self.settle_due()
            self.check_all()
            self.ask_consumer("stop")
        finally:
            self.close()
        return self.counts

    # --- taking and acting -----------------------------------------------------------------

    def due(self) -> float:
        roll = self.rng.random()
        if roll < 0.005 and self.forever < 40:
            self.forever += 1
            return float("inf")
        return self.step + self.rng.randint(0, 60 if roll < 0.5 else 5)

    def take(self, batch: Any, extras: list[torch.Tensor], viewed: bool) -> None:
        offsets, nbytes = _offsets(batch), batch.layout.nbytes
        expected = _batch_bytes(batch, offsets, nbytes)
        group = Group(f"the batch of sample {int(batch['i'][0])}", expected, frozen=viewed, offsets=offsets)
        if self.rng.random() < 0.4:
            self.hold("batch", batch, lambda b=batch: _batch_bytes(b, offsets, nbytes), group, 0, nbytes)
        base = batch.buffer.data_ptr()
        for extra in extras:
            if self.rng.random() < 0.7:
                kind, read = "tensor returned beside a batch", lambda t=extra: _bytes(t)
                at = extra.data_ptr() - base
                if 0 <= at < nbytes:  # in the batch's buffer (made in this process)
                    self.hold(kind, extra, read, group, at, at + extra.nbytes)
                else:  # a copy of its own, made as it left the worker
                    alone = Group(f"a tensor returned beside {group.name}", _bytes(extra).copy())
                    self.hold(kind, extra, read, alone, 0, len(alone.expected))
        roll = self.rng.random()
        leaf = batch["x"] if self.rng.random() < 0.6 else batch["y"]
        start = leaf.data_ptr() - base
        # Raw views are the ones a reuse would hurt: they are kept longer.
        if roll < 0.15:
            rows = leaf[self.rng.randint(0, leaf.shape[0] - 1) :]
            at = rows.data_ptr() - base
            self.hold("slice", rows, lambda r=rows: _bytes(r), group, at, at + rows.nbytes)
        elif roll < 0.3:
            array = leaf.numpy()
            self.hold(
                "numpy view", array, lambda a=array: a.view(np.uint8).reshape(-1), group, start, start + leaf.nbytes, 40
            )
        elif roll < 0.36:
            view = memoryview(leaf.numpy())
            self.hold(
                "memoryview",
                view,
                lambda v=view: np.frombuffer(v, dtype=np.uint8),
                group,
                start,
                start + leaf.nbytes,
                40,
            )
        elif roll < 0.42:
            array = np.from_dlpack(leaf)
            self.hold(
                "DLPack array",
                array,
                lambda a=array: a.view(np.uint8).reshape(-1),
                group,
                start,
                start + leaf.nbytes,
                40,
            )
        elif roll < 0.5:
            storage = leaf.untyped_storage()
            size = min(storage.nbytes(), nbytes)
            read = lambda s=storage, n=size: torch.empty(0, dtype=torch.uint8).set_(s)[:n].numpy()  # noqa: E731
            self.hold("storage", storage, read, group, start, start + size, 40)
        roll = self.rng.random()
        if roll < 0.08:
            if self.rng.random() < 0.6:
                self.send(batch, group)
            else:
                self.send(leaf, group, start, start + leaf.nbytes)
        elif roll < 0.13:
            leaf.share_memory_()
            group.frozen = True  # views made before now keep the old memory
            self.count("share_memory_")

    def hold(
        self, kind: str, obj: Any, read: Callable[[], np.ndarray], group: Group, start: int, stop: int, least: int = 0
    ) -> None:
        holder = Holder(kind, obj, read, group, start, stop, max(self.due(), self.step + least))
        holder.check(self.where())
        self.holders.append(holder)
        self.count(kind)

    def act(self) -> None:
        rng = self.rng
        batches_held = [h for h in self.holders if h.kind == "batch" and not h.group.frozen]
        if batches_held and rng.random() < 0.05:
            holder = rng.choice(batches_held)
            x = holder.obj["x"]
            if x.numel():
                value = np.float32(-1 - self.step)
                x.view(-1)[0] = float(value)
                at = holder.group.offsets["x"]
                holder.group.expected[at : at + 4] = np.frombuffer(value.tobytes(), dtype=np.uint8)
                self.count("write")
        if batches_held and rng.random() < 0.02:
            holder = rng.choice(batches_held)
            holder.obj["x" if rng.random() < 0.5 else "y"].share_memory_()
            holder.group.frozen = True  # views made before now keep the old memory
            self.count("share_memory_")
        if self.holders and rng.random() < 0.03:
            holder = rng.choice(self.holders)
            if isinstance(holder.obj, torch.Tensor) or holder.kind == "batch":
                self.send(holder.obj, holder.group, holder.start, holder.stop)
        if rng.random() < 0.004 and len(self.children) < 2:
            self.fork()
        if rng.random() < 0.02:
            gc.collect()
            self.count("gc")
        if self.step % 100 == 99:
            self.check_all()
        elif self.holders:
            for holder in rng.sample(self.holders, min(8, len(self.holders))):
                holder.check(self.where())

    def settle_due(self) -> None:
        keep = []
        for holder in self.holders:
            if holder.due <= self.step:
                holder.check(self.where())
            else:
                keep.append(holder)
        self.holders = keep
        for key, due in list(self.sent.items()):
            if due <= self.step:
                self.inbox.put(("drop", key))
                del self.sent[key]
        for child in list(self.children):
            if child[3] <= self.step:
                self.children.remove(child)
                self.ask_child(child)

    def check_all(self) -> None:
        for holder in self.holders:
            holder.check(self.where())
        self.ask_consumer("check")

    # --- other processes ------------------------------------------------------------------------

    def send(self, obj: Any, group: Group, start: int | None = None, stop: int | None = None) -> None:
        key = self.rng.getrandbits(48)
        tensor = isinstance(obj, torch.Tensor)
        expected = group.expected[start:stop] if tensor else group.expected
        group.frozen = True  # it shares memory with the consumer from now on
        self.inbox.put(("keep", key, obj, expected.copy(), None if tensor else group.offsets))
        self.sent[key] = int(min(self.due(), self.step + 200))
        self.count("sent")

    def ask_consumer(self, what: str) -> None:
        self.inbox.put((what,))
        deadline = time.monotonic() + 120
        while True:
            try:
                bad = self.outbox.get(timeout=1)
                break
            except queues.Empty:
                if not self.consumer.is_alive():
                    code = self.consumer.exitcode
                    raise FuzzError(f"{self.where()}: the consumer process died (exit code {code})") from None
                if time.monotonic() > deadline:
                    raise FuzzError(f"{self.where()}: the consumer did not answer") from None
        if bad:
            raise FuzzError(f"{self.where()}: in the consumer process: {bad[0]} (and {len(bad) - 1} more)")

    def fork(self) -> None:
        for holder in self.holders:
            holder.group.frozen = True  # shared memory is shared with the child from now on
        go_read, go_write = os.pipe()
        answer_read, answer_write = os.pipe()
        with warnings.catch_warnings():
            warnings.simplefilter("ignore", DeprecationWarning)  # fork with threads (Python 3.12+)
            pid = os.fork()
        if pid == 0:
            code = b"1"
            try:
                os.read(go_read, 1)
                for holder in self.holders:
                    holder.check("in a fork child")
            except BaseException as error:
                code = str(error).encode()[:500] or b"?"
            os.write(answer_write, code)
            os._exit(0)
        os.close(go_read)
        os.close(answer_write)
        self.children.append((pid, go_write, answer_read, self.step + self.rng.randint(3, 40)))
        self.count("fork")

    def ask_child(self, child: tuple[int, int, int, int]) -> None:
        pid, go, answer, _ = child
        try:
            os.write(go, b"x")
            ready, _, _ = select.select([answer], [], [], 120)
            reply = os.read(answer, 600) if ready else b"no answer"
        finally:
            os.close(go)
            os.close(answer)
            os.waitpid(pid, 0)
        if reply != b"1":
            raise FuzzError(f"{self.where()}: a fork child's copy: {reply.decode(errors='replace')}")

    def close(self) -> None:
        for child in self.children:
            with contextlib.suppress(FuzzError):  # the run failed already; the child is reaped either way
                self.ask_child(child)
        self.children.clear()
        self.holders.clear()
        if self.consumer.is_alive():
            self.consumer.kill()
        self.consumer.join(60)
        self.consumer.close()  # its sentinel pipe
        for q in (self.inbox, self.outbox):
            q.cancel_join_thread()  # nobody reads what is still queued: do not wait to write it
            q.close()
        _kept_in_worker.clear()
        resource_sharer.stop()  # multiprocessing's fd-passing thread, started by sending
        gc.collect()


def run(config: Config, seed: int, steps: int) -> dict[str, int]:
    """Run the program once; raises :class:`FuzzError` naming what changed and where."""
    return Program(config, seed, steps).run()


def _configs(steps: int, chosen: list[int]) -> Iterator[tuple[Config, int]]:
    configs = [CONFIGS[i] for i in chosen] if chosen else list(CONFIGS)
    share = max(1, steps // len(configs))
    for config in configs:
        yield config, share


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    parser.add_argument("--steps", type=int, default=100_000, help="batches in all, shared by the configurations")
    parser.add_argument("--seed", type=int, default=0)
    parser.add_argument(
        "--config",
        type=int,
        action="append",
        default=[],
        help="run only this configuration (repeatable): "
        + "; ".join(f"{i} = {config}" for i, config in enumerate(CONFIGS)),
    )
    args = parser.parse_args(argv)
    total = 0
    for config, steps in _configs(args.steps, args.config):
        started = time.perf_counter()
        counts = run(config, args.seed, steps)
        total += steps
        took = time.perf_counter() - started
        done = ", ".join(f"{what} {n}" for what, n in sorted(counts.items()))
        print(f"{config}: {steps:,} steps in {took:.0f} s, passed ({done})", flush=True)
    print(f"lifetime fuzzer: {total:,} steps, seed {args.seed}, passed")
    return 0


if __name__ == "__main__":
    sys.path.insert(0, os.path.dirname(os.path.abspath(__file__)))
    import lifetime  # spawned workers find the classes under the module's own name

    sys.exit(lifetime.main())

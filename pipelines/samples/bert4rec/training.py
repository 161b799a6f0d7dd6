"""Training the demo's BERT4Rec on synthetic sessions with structure, on the CPU in seconds, so that its
recommendations can be scored against held-out sessions (hit rate@10; chance is 10 / items).

The world: a seeded Markov chain over the catalogue's vocabulary indices 1..items. The items lie on a hidden
circle (a permutation of the catalogue fixed by `world_seed` alone, so models trained with different seeds
learn the same world): an item's likely successors are the next `len(SUCCESSOR_P)` items on the circle, and
with chance `NOISE` the next item is a jump to any item, drawn by a popularity (a seeded Zipf-like weight per
item) that also draws each session's first item. So some items are visited far more than others.

Training is exactly the served call: the first L - 1 items of a session, then the mask token at position
L - 1 (`mask_pos`), and the L-th item as the target of a cross-entropy over `BERT4Rec.item_logits`; L is
drawn per batch from the served lengths (DYNAMIC_SIGNATURE's 4 to size.length); every batch is fresh sessions.
A `corrupted` log (each session's items shuffled) trains as fast and recommends little better than chance.

    python -m pipelines.samples.bert4rec.training --seed 0 --checkpoint v1.pt --eval-out eval.parquet
"""

from __future__ import annotations

import argparse
import time
from pathlib import Path

import numpy as np
import torch
from torch import nn

from pipelines.samples.bert4rec import DEMO, DYNAMIC_SIGNATURE, TOP_K, BERT4Rec, LongHistoryCost, Size

SUCCESSOR_P = (0.5, 0.25, 0.15)  # the chances of the next, second and third item on the circle
NOISE = 1.0 - sum(SUCCESSOR_P)  # the chance of a jump to any item, drawn by popularity
MIN_LENGTH = DYNAMIC_SIGNATURE["dims"]["length"]["min"]  # the shortest sequence served (mask included)
ZIPF_OFFSET = 10.0  # an item's popularity is 1 / (rank + ZIPF_OFFSET) over a seeded order
HEAD_SHARE = 0.2  # eval_set's "head": sessions whose last item is among the 20% most visited items
DEFAULT_STEPS = 1500  # about 20 s on one core; hit rate@10 about 0.88 at length 20
# One thread: at these small matmuls a second one gains nothing (5.1 s against 5.3 s for 150 steps here), and
# beside a CPU-bound process two spinning OpenMP threads took 2.8 times as long (14.7 s against 5.5 s).
TRAINING_THREADS = 1
BATCH = 64
LEARNING_RATE = 1e-3


def world(size: Size = DEMO, world_seed: int = 0) -> tuple[np.ndarray, np.ndarray]:
    """The chain: each item's likely successors, most likely first, int64 [items + 1, len(SUCCESSOR_P)], and
    the popularity that draws first items and jumps, float64 [items + 1] summing to 1 (row and entry 0:
    padding, unused)."""
    rng = np.random.default_rng((world_seed, 0x57A7))  # never the draws of a session seed
    circle = rng.permutation(size.items) + 1
    successors = np.zeros((size.items + 1, len(SUCCESSOR_P)), dtype=np.int64)
    for ahead in range(1, len(SUCCESSOR_P) + 1):
        successors[circle, ahead - 1] = np.roll(circle, -ahead)
    popularity = np.zeros(size.items + 1)
    popularity[rng.permutation(size.items) + 1] = 1.0 / (np.arange(size.items) + ZIPF_OFFSET)
    return successors, popularity / popularity.sum()


def visits(size: Size = DEMO, world_seed: int = 0) -> np.ndarray:
    """Each item's share of all visits in the long run (the chain's stationary distribution), [items + 1]."""
    successors, popularity = world(size, world_seed)
    transition = np.outer(np.ones(size.items + 1), NOISE * popularity)
    for rank, p in enumerate(SUCCESSOR_P):
        transition[np.arange(1, size.items + 1), successors[1:, rank]] += p
    share = popularity
    for _ in range(300):  # power iteration
        share = share @ transition
    return share


def _walk(count: int, length: int, rng: np.random.Generator, size: Size, world_seed: int) -> np.ndarray:
    """`count` walks of `length` items on the world's chain, int64 [count, length]."""
    successors, popularity = world(size, world_seed)
    sessions = np.empty((count, length), dtype=np.int64)
    sessions[:, 0] = rng.choice(size.items + 1, size=count, p=popularity)
    cumulative = np.cumsum(SUCCESSOR_P)
    for step in range(1, length):
        rank = np.searchsorted(cumulative, rng.random(count), side="right")  # len(SUCCESSOR_P): a jump
        chosen = successors[sessions[:, step - 1], np.minimum(rank, len(SUCCESSOR_P) - 1)]
        jump = rng.choice(size.items + 1, size=count, p=popularity)
        sessions[:, step] = np.where(rank == len(SUCCESSOR_P), jump, chosen)
    return sessions


def synthetic_sessions(
    count: int, seed: int, size: Size = DEMO, world_seed: int = 0, corrupted: bool = False
) -> np.ndarray:
    """`count` sessions of `size.length` item indices (1..items), int64 [count, size.length], walked on the
    world's chain. `corrupted`: a broken log, each session's items shuffled (the same items, order lost)."""
    rng = np.random.default_rng(seed)
    sessions = _walk(count, size.length, rng, size, world_seed)
    return rng.permuted(sessions, axis=1) if corrupted else sessions


def _served_batch(sessions: np.ndarray, size: Size) -> tuple[torch.Tensor, torch.Tensor, torch.Tensor]:
    """Sessions [B, L] as served: the first L - 1 items then the mask token, its position, the L-th item."""
    count, length = sessions.shape
    item_ids = sessions.copy()
    item_ids[:, -1] = size.items + 1
    mask_pos = np.full((count, 1), length - 1, dtype=np.int64)
    return torch.from_numpy(item_ids), torch.from_numpy(mask_pos), torch.from_numpy(sessions[:, -1].copy())


def _rescaled(model: BERT4Rec) -> BERT4Rec:
    """`model` with its encoder's and head's linear layers drawn again at std 1 / sqrt(fan_in). BERT's std
    0.02 is sized for hidden 768: at hidden 64 the masked position's state hardly depends on the items
    (0.3%), and training at varying lengths flattens the output to one list for everyone (loss ln(items))."""
    with torch.no_grad():
        for layer in model.bert.modules():
            if isinstance(layer, nn.Linear) and layer is not model.bert.cls.predictions.decoder:  # tied: embeddings
                layer.weight.normal_(0.0, layer.in_features**-0.5)
    return model


def train(seed: int, steps: int = DEFAULT_STEPS, corrupted: bool = False, size: Size = DEMO) -> BERT4Rec:
    """`BERT4Rec(size, seed=seed)` trained for `steps` batches of `BATCH` fresh sessions (seeded by `seed`,
    `corrupted` or not) to predict a session's last item from the items before it; in eval mode. Dropout
    stays off (the model trains in eval mode): every batch is new data, nothing to regularise."""
    threads = torch.get_num_threads()
    torch.set_num_threads(TRAINING_THREADS)
    try:
        return _trained(seed, steps, corrupted, size)
    finally:
        torch.set_num_threads(threads)


def _trained(seed: int, steps: int, corrupted: bool, size: Size) -> BERT4Rec:
    torch.manual_seed(seed)
    model = _rescaled(BERT4Rec(size, seed=seed).eval())
    sessions = synthetic_sessions(steps * BATCH, seed, size, corrupted=corrupted)
    lengths = np.random.default_rng((seed, 0x1E)).integers(MIN_LENGTH, size.length + 1, size=steps)
    optimizer = torch.optim.Adam(model.parameters(), lr=LEARNING_RATE)
    warmup = max(1, steps // 20)
    schedule = torch.optim.lr_scheduler.LambdaLR(  # linear warm-up, then linear decay to 0
        optimizer, lambda step: min((step + 1) / warmup, (steps - step) / max(1, steps - warmup))
    )
    for step, length in enumerate(lengths):
        item_ids, mask_pos, target = _served_batch(sessions[step * BATCH : (step + 1) * BATCH, :length], size)
        loss = nn.functional.cross_entropy(model.item_logits(item_ids, mask_pos), target - 1)
        optimizer.zero_grad(set_to_none=True)
        loss.backward()
        optimizer.step()
        schedule.step()
    return model.eval()


def eval_set(rows: int, seed: int, size: Size = DEMO, length: int = 20, world_seed: int = 0) -> dict[str, np.ndarray]:
    """Held-out sessions (never the draws of `synthetic_sessions(..., seed)`, so never training's) as the
    serving inputs plus the label: `item_ids` int64 [rows, length] (length - 1 history items then the mask
    token), `mask_pos` int64 [rows, 1], `next_item` int64 [rows] (vocabulary index 1..items, what
    `topk_indices` returns) and `segment` [rows] str: "head" when the last history item, the one the next item
    follows, is among the `HEAD_SHARE` most visited items (`visits`), else "tail" (items trained on less)."""
    sessions = _walk(rows, length, np.random.default_rng((seed, 0xE7A1)), size, world_seed)
    item_ids, mask_pos, next_item = (t.numpy() for t in _served_batch(sessions, size))
    head = np.argsort(-visits(size, world_seed))[: int(HEAD_SHARE * size.items)]
    segment = np.where(np.isin(sessions[:, -2], head), "head", "tail")
    return {"item_ids": item_ids, "mask_pos": mask_pos, "next_item": next_item, "segment": segment}


@torch.no_grad()
def hit_rate_at_10(model: nn.Module, data: dict[str, np.ndarray]) -> float:
    """The share of rows whose `next_item` is among the model's top 10 (`model` returns indices, scores)."""
    hits = 0
    for start in range(0, len(data["next_item"]), 256):
        item_ids = torch.from_numpy(data["item_ids"][start : start + 256])
        mask_pos = torch.from_numpy(data["mask_pos"][start : start + 256])
        indices = model(item_ids, mask_pos)[0][:, :TOP_K].numpy()
        hits += int((indices == data["next_item"][start : start + 256, None]).any(axis=1).sum())
    return hits / len(data["next_item"])


def save_checkpoint(model: BERT4Rec, path: Path | str, window: int = 1) -> None:
    """The state_dict of `LongHistoryCost(model, window)`, what the demo factories build, to `path`: loads
    into `demo_v1()`, `demo_v2()` and `demo_v4_long_history()` (the window is not a weight)."""
    torch.save(LongHistoryCost(model, window).state_dict(), path)


def train_to(out_path: str, seed: int) -> dict[str, float]:
    """A training pipeline's trainer (pipelines/examples/train_and_release.py): the demo's model trained with
    `seed`, its checkpoint saved to `out_path`, its hit rate@10 on held-out sessions returned."""
    model = train(seed)
    save_checkpoint(model, out_path)
    return {"hit_rate_at_10": hit_rate_at_10(model, eval_set(1000, seed=7))}


def write_eval(data: dict[str, np.ndarray], path: Path | str) -> None:
    """An eval set as Parquet (item_ids and mask_pos as fixed-size list<int64> columns) or, for a .npz path, npz."""
    path = Path(path)
    if path.suffix == ".npz":
        np.savez(path, **data)
        return
    import pyarrow as pa
    import pyarrow.parquet as pq

    columns = {
        k: pa.FixedSizeListArray.from_arrays(pa.array(v.reshape(-1)), v.shape[1]) if v.ndim == 2 else pa.array(v)
        for k, v in data.items()
    }
    pq.write_table(pa.table(columns), path)


def main(argv: list[str] | None = None) -> None:
    """The command line: train, save the checkpoint, optionally write an eval set."""
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    parser.add_argument("--seed", type=int, required=True, help="the model's and its training data's seed")
    parser.add_argument("--corrupted", action="store_true", help="train on a broken log (order lost)")
    parser.add_argument("--steps", type=int, default=DEFAULT_STEPS, help=f"batches of {BATCH} sessions")
    parser.add_argument("--checkpoint", type=Path, required=True, help="where the state_dict goes (.pt)")
    parser.add_argument("--eval-out", type=Path, help="also write an eval set here (.parquet or .npz)")
    parser.add_argument("--rows", type=int, default=2000, help="the eval set's rows")
    parser.add_argument("--eval-seed", type=int, default=1000, help="the eval set's seed")
    args = parser.parse_args(argv)
    started = time.perf_counter()
    model = train(args.seed, args.steps, args.corrupted)
    took = time.perf_counter() - started
    save_checkpoint(model, args.checkpoint)
    data = eval_set(args.rows, args.eval_seed)
    print(f"trained in {took:.1f} s; hit rate@10 {hit_rate_at_10(model, data):.3f} (chance {TOP_K / DEMO.items:.3f})")
    if args.eval_out:
        write_eval(data, args.eval_out)


if __name__ == "__main__":
    main()

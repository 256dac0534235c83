"""The loader's position, a contract: `Loader.state_dict()` / `Loader.load_state_dict()`, and `resume(loader, state)`,
the one place a saved state is compared with a loader (what a state holds and what a resume on another order does:
docs/design.md, "The position is a contract").
"""

from __future__ import annotations

from dataclasses import asdict

import numpy as np

from ..checks import is_int
from .sampler import EpochOrder, ShuffledOrder, deal
from .windowed import FollowedOrder, WindowedOrder, node_layout

FORMAT = "fastfeed-loader-state"
VERSION = 1
_PLANS = ("workers", "partner_buffer", "imgsz", "augment")   # they shape the plans, not which records


class ResumeError(ValueError):
    """A saved loader state that cannot be continued by this loader (another store, an order it cannot rebuild)."""


def build_order(identity: dict, rank: int) -> EpochOrder:
    """The order `identity` describes, for `rank` (what recomputes a saved run's batches)."""
    i = identity
    kind = i.get("kind")
    if kind == "shuffle":
        return ShuffledOrder(i["n"], i["batch_size"], seed=i["seed"], rank=rank, world_size=i["world_size"],
                             shuffle=i["shuffle"], drop_last=i["drop_last"])
    if kind == "windowed":
        return WindowedOrder([tuple(s) for s in i["shards"]], i["batch_size"], window=i["window"], seed=i["seed"],
                             rank=rank, world_size=i["world_size"], local_world=i["local_world"],
                             drop_last=i["drop_last"], ramp=i.get("ramp", 0))
    if kind == "remainder":
        return Remainder(build_order(i["base"], rank), i["epoch"], i["prior"], i["done"])
    raise ResumeError(f"the checkpoint's epoch order ({kind}) cannot be rebuilt here: resume on the same topology "
                      "(ranks, batch size) or at an epoch's end")


def identity_at(identity: dict, epoch: int) -> dict:
    """The identity of the order that gives `epoch`'s batches (a remainder's own epoch only; else its base)."""
    while identity.get("kind") == "remainder" and identity["epoch"] != epoch:
        identity = identity["base"]
    return identity


class Remainder(EpochOrder):
    """`base`'s batches, except in `epoch`: the records the `prior` order (an identity) had not given any of its
    ranks in its first `done` batches, dealt to `base`'s ranks (docs/design.md, 'The position is a contract'). That
    epoch keeps `len(base)` batches, the first ones empty (already trained): the loader starts after them."""

    def __init__(self, base: EpochOrder, epoch: int, prior: dict, done: int):
        self.base, self.epoch, self.prior, self.done = base, int(epoch), dict(prior), int(done)
        self.rank, self.world_size = base.rank, base.world_size
        self.batch_size, self.drop_last = base.batch_size, getattr(base, "drop_last", True)
        self.local_world = getattr(base, "local_world", 1)
        self._mine: list[np.ndarray] | None = None
        self.rest = self.left_out = 0   # records not yet trained; those drop_last left out (all ranks together)

    def remaining(self) -> np.ndarray:
        """The records of `epoch` the prior order had not reached, in its reading order (batch by batch, rank by
        rank)."""
        olds = [build_order(self.prior, r).batches(self.epoch) for r in range(self.prior["world_size"])]
        parts = [np.asarray(b[k], np.int64) for k in range(self.done, max(map(len, olds))) for b in olds if k < len(b)]
        return np.concatenate(parts) if parts else np.zeros(0, np.int64)

    def own(self) -> list[np.ndarray]:
        """This rank's batches of the rest of `epoch` (the same count on every rank)."""
        if self._mine is None:
            seq, world, b, drop = self.remaining(), self.world_size, self.batch_size, self.drop_last
            self.rest = len(seq)
            per_rank = len(seq) // world if drop else -(-len(seq) // world)
            if per_rank * world > len(seq):   # padded by wrapping around, as an epoch's tail
                seq = np.tile(seq, -(-per_rank * world // len(seq)))[:per_rank * world]
            node, _, local, lw = node_layout(self.rank, world, self.local_world)
            part = per_rank * lw   # a node reads one contiguous part of the rest (a windowed order's shards stay near)
            self._mine = deal(seq[node * part:(node + 1) * part], local, lw, per_rank, b, drop)
            self.left_out = self.rest - len(self._mine) * b * world if drop else 0
            if len(self._mine) > len(self.base):
                raise ResumeError(f"the rest of epoch {self.epoch + 1} takes {len(self._mine)} batches per rank, more "
                                  f"than an epoch's {len(self.base)}")
        return self._mine

    def skipped(self) -> int:
        """The empty batches that open `epoch` (where the loader starts)."""
        return len(self.base) - len(self.own())

    def batches(self, epoch: int) -> list[np.ndarray]:
        if int(epoch) != self.epoch:
            return self.base.batches(epoch)
        return [np.zeros(0, np.int64)] * self.skipped() + self.own()

    def __len__(self) -> int:
        return len(self.base)

    def samples(self) -> int:
        return self.base.samples()

    def describe(self) -> dict:
        return self.base.describe()

    def identity(self) -> dict:
        return {"kind": "remainder", "world_size": self.world_size, "epoch": self.epoch, "prior": self.prior,
                "done": self.done, "base": self.base.identity()}

    def __getstate__(self):
        return self.__dict__ | {"_mine": None}


def state_of(loader, epoch: int, batches: int) -> dict:
    """`loader.state_dict()`: `batches` consumed into `epoch` on every rank, and what makes them."""
    if batches >= len(loader):
        epoch, batches = epoch + 1, 0
    opts = getattr(loader, "opts", None)
    c = loader.cfg
    return {"format": FORMAT, "version": VERSION, "epoch": int(epoch), "batches": int(batches),
            "records": len(loader.store), "order": identity_at(loader.order.identity(), epoch),
            "world_size": loader.world_size, "batch_size": c.batch_size, "seed": c.seed, "workers": c.workers,
            "partner_buffer": getattr(opts, "partner_buffer", None), "imgsz": c.imgsz, "augment": c.augment,
            "hyp": {k: list(v) if isinstance(v, tuple) else v for k, v in asdict(c.hyp).items()},   # as JSON reads it
            "close_mosaic": c.close_mosaic, "epochs": c.epochs, "task": loader.task}


def legacy_state(loader, epoch: int, batches: int, *, batch_size: int | None = None,
                 world_size: int | None = None) -> dict:
    """The state of a checkpoint written before this contract (its position, and the batch size and world size
    it may name): taken as of `loader`'s own order with those two, the rest unknown and so assumed unchanged."""
    state = state_of(loader, epoch, 0) | {"epoch": int(epoch), "batches": int(batches)}
    order = dict(state["order"])
    for k, v in (("batch_size", batch_size), ("world_size", world_size)):
        if v is not None and k in order:
            state[k] = order[k] = int(v)
    return state | {"order": order}


def _changes(saved: dict, ours: dict, keys) -> list[str]:
    """`key old -> new` for each of `keys` that changed; one an older state does not hold is unknown: as ours."""
    return [f"{k.replace('_', ' ')} {saved[k]} -> {ours.get(k)}" for k in keys if k in saved and saved[k] != ours.get(k)]


def _closes(state: dict) -> str:
    n, epochs = state.get("close_mosaic"), state.get("epochs")
    return f"from epoch {max(epochs - n, 0) + 1}" if n and epochs else "never"


def _samples(saved: dict, ours: dict) -> list[str]:
    """What other gains, another close_mosaic schedule or another task do: the batches' records stay, the samples not."""
    out = []
    if gains := _changes(saved.get("hyp") or {}, ours["hyp"], ours["hyp"]):
        out.append("gains " + ", ".join(gains) + ": the samples from here are augmented with the new gains")
    if "close_mosaic" in saved and _closes(saved) != _closes(ours):
        out.append(", ".join(_changes(saved, ours, ("close_mosaic", "epochs"))) + f": mosaic off {_closes(ours)} "
                   f"(the run had it off {_closes(saved)})")
    if _changes(saved, ours, ("task",)):
        out.append(f"task {saved['task']} -> {ours['task']}: the batches carry {ours['task']} labels from here "
                   "(the model must read them)")
    return out


def _ramp(state: dict, ours: dict) -> list[str]:
    """A windowed order saved before its first window ramped (`windowed.RAMP`), named (its epoch's rest is its own)."""
    old, new = identity_at(state["order"], int(state["epoch"])), ours["order"]
    if not old.get("kind") == new.get("kind") == "windowed" or old.get("ramp") == new.get("ramp"):
        return []
    return [f"the windowed order's first window ramp {old.get('ramp', 'none')} -> {new.get('ramp', 'none')}"]


def same_order(loader, state: dict) -> bool:
    """Whether `state`'s epoch goes on in `loader`'s own order (the exact continuation `resume` takes for it)."""
    epoch = int(state["epoch"])
    return identity_at(state["order"], epoch) == state_of(loader, epoch, 0)["order"]


def resume(loader, state: dict) -> str:
    """Put `loader` where `state` (a `state_dict()`) left off (module docstring); returns the line that says so."""
    if not isinstance(state, dict) or state.get("format") != FORMAT:
        raise ResumeError(f"not a fastfeed loader state (no '{FORMAT}' marker): {type(state).__name__}")
    if state.get("version") != VERSION:
        raise ResumeError(f"loader state version {state.get('version')}; this fastfeed reads version {VERSION}")
    for key in ("epoch", "batches", "records", "order"):   # a tampered or hand-made state: named, not a KeyError
        value = state.get(key)
        if not (isinstance(value, dict) if key == "order" else is_int(value) and value >= 0):
            raise ResumeError(f"loader state's {key!r} is {repr(value) if key in state else 'missing'}, not "
                              f"{'an order' if key == 'order' else 'an integer >= 0'}: pass a loader.state_dict()")
    epoch, done = int(state["epoch"]), int(state["batches"])
    ours = state_of(loader, epoch, 0)
    if state["records"] != ours["records"]:
        raise ResumeError(f"the checkpoint's loader read a store of {state['records']} records; this one holds "
                          f"{ours['records']}: resume with the run's own data")
    where = f"epoch {epoch + 1} after {done} batches per rank" if done else f"epoch {epoch + 1} from its start"
    plans, samples = _changes(state, ours, _PLANS), _samples(state, ours)
    if same_order(loader, state):
        if done > len(loader):
            raise ResumeError(f"the loader state is {done} batches into epoch {epoch + 1}, which has {len(loader)} in "
                              "this order: pass the loader.state_dict() of this run")
        loader.set_epoch(epoch, done)
        what = ("the batches an uninterrupted run trains next" if not plans + samples else
                "the same records in the same batches" if not plans else
                "the same records in the same batches; mosaic partners and plans as an uninterrupted run with the new "
                "settings draws them")
        return f"resuming {where}: " + "; ".join(plans + samples + [what])
    changed = _changes(state, ours, ("world_size", "batch_size", "seed")) + _ramp(state, ours) + plans
    said = "".join(f"; {s}" for s in samples)
    if not done:
        loader.set_epoch(epoch, 0)
        return (f"resuming {where}: " + ", ".join(changed or ["another epoch order"]) + "; the epoch follows the new "
                f"order{said}")
    order, followed = loader.order, isinstance(loader.order, FollowedOrder)   # a shard cache follows what is read
    rest = Remainder(order.base if followed else order, epoch, state["order"], done)   # what the saved order had not reached
    loader.use_order(order.with_base(rest) if followed else rest)
    loader.set_epoch(epoch, rest.skipped())
    dropped = f", {rest.left_out} left out (drop_last: they fill no batch on every rank)" if rest.left_out else ""
    return (f"resuming {where}: " + ", ".join(changed or ["another epoch order"]) + f": the {rest.rest} "
            f"records of the epoch not yet trained are dealt to {loader.world_size} rank(s), {len(rest.own())} batches "
            f"each{dropped}; later epochs follow the new order{said}")

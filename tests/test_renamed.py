"""Renamed public names (docs/design.md, "Vocabulary"): each old name still works and warns naming the new one; the
new name works without a warning. One row per renamed name; `fastfeed/renamed.py` is the one place that keeps them."""

import warnings

import pytest

from fastfeed.store.options import StoreOptions

RENAMED = [   # (class, old name, new name, a value)
    (StoreOptions, "cache_dir", "shard_cache", "/nvme/shards"),
    (StoreOptions, "cache_limit", "shard_cache_limit", "50G"),
]


@pytest.mark.parametrize("cls, old, new, value", RENAMED, ids=[f"{c.__name__}.{o}" for c, o, _, _ in RENAMED])
def test_an_old_name_works_and_warns_with_the_new_one(cls, old, new, value):
    with pytest.warns(DeprecationWarning, match=rf"{cls.__name__}\({old}=...\) is deprecated: use "
                                                rf"{cls.__name__}\({new}=...\)"):
        obj = cls(**{old: value})
    assert getattr(obj, new) == value
    with pytest.warns(DeprecationWarning, match=rf"{cls.__name__}\.{old} is deprecated: use {cls.__name__}\.{new}"):
        assert getattr(obj, old) == value
    with pytest.raises(TypeError, match=f"give {new} only"):
        cls(**{old: value, new: value})


@pytest.mark.parametrize("cls, old, new, value", RENAMED, ids=[f"{c.__name__}.{n}" for c, _, n, _ in RENAMED])
def test_the_new_name_works_without_a_warning(cls, old, new, value):
    with warnings.catch_warnings():
        warnings.simplefilter("error")
        assert getattr(cls(**{new: value}), new) == value


def test_store_keywords_take_the_old_names_too():
    """`Store(url, cache_dir=...)` passes its keywords through `StoreOptions.of`, which translates them."""
    with pytest.warns(DeprecationWarning, match=r"use StoreOptions\(shard_cache=...\)"):
        opts = StoreOptions.of(StoreOptions(shard_cache_limit="9G"), cache_dir="/d")
    assert (opts.shard_cache, opts.shard_cache_limit) == ("/d", "9G")

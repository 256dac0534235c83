"""Renamed public names (docs/design.md, "Vocabulary"): each old name still works and warns naming the new one; the
new name works without a warning. One row per renamed name; `fastfeed/renamed.py` is the one place that keeps them."""

import warnings

import pytest

from fastfeed.cli import build_parser
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


FLAGS = [   # (the command before the flag, old flag, new flag, its dest)
    (["cache", "ls"], "--dir", "--shm-dir", "shm_dir"),
    (["cache", "clear"], "--dir", "--shm-dir", "shm_dir"),
    (["cache", "build", "s.ff"], "--dir", "--shm-dir", "shm_dir"),
    (["cache", "ls"], "--shard-dir", "--shard-cache", "shard_cache"),
    (["cache", "clear"], "--shard-dir", "--shard-cache", "shard_cache"),
]


@pytest.mark.parametrize("command, old, new, dest", FLAGS, ids=[f"{' '.join(c[:2])} {o}" for c, o, _, _ in FLAGS])
def test_an_old_flag_works_and_warns_with_the_new_one(command, old, new, dest, tmp_path, capsys):
    argv = command + [old, str(tmp_path)]
    with pytest.warns(DeprecationWarning, match=f"{old} is deprecated: use {new} "):
        assert getattr(build_parser(argv).parse_args(argv), dest) == str(tmp_path)
    argv = command + [new, str(tmp_path)]
    with warnings.catch_warnings():
        warnings.simplefilter("error")
        assert getattr(build_parser(argv).parse_args(argv), dest) == str(tmp_path)
    with pytest.raises(SystemExit):
        build_parser(command).parse_args(command + ["--help"])
    shown = capsys.readouterr().out
    assert new in shown and old + " " not in shown   # only the new name is shown


def test_the_old_read_ahead_variable_works_and_warns_and_the_new_one_wins():
    with pytest.warns(DeprecationWarning, match=r"\$FASTFEED_PREFETCH_SHARDS is deprecated: use "
                                                r"\$FASTFEED_READ_AHEAD_SHARDS"):
        assert StoreOptions.from_env({"FASTFEED_PREFETCH_SHARDS": "4"}).read_ahead == 4
    with warnings.catch_warnings():
        warnings.simplefilter("error")
        both = {"FASTFEED_PREFETCH_SHARDS": "4", "FASTFEED_READ_AHEAD_SHARDS": "1"}
        assert StoreOptions.from_env(both).read_ahead == 1

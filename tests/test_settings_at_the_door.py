"""Settings are read once, at the entry points: the CLI and the Ultralytics integration resolve flags and the
`FASTFEED_*` variables into the option objects (`StoreOptions.from_env`); nothing below them reads the environment."""

from __future__ import annotations

import argparse
import os
import re
from pathlib import Path

import pytest

import fastfeed
from fastfeed.store import objstore
from fastfeed.store.options import StoreOptions

PACKAGE = Path(fastfeed.__file__).parent
BELOW = ("store", "loaders", "prefetch", "augment", "pack")   # the one exception, fastfeed/devices.py (the device
                                                              # boundary: CUDA_VISIBLE_DEVICES...), is not below
READS = re.compile(r"os\.environ|getenv\(")


def test_nothing_below_the_entry_points_reads_the_environment():
    found = [f"{p.relative_to(PACKAGE)}:{n}: {line.strip()}"
             for folder in BELOW for p in sorted((PACKAGE / folder).rglob("*.py"))
             for n, line in enumerate(p.read_text(encoding="utf-8").splitlines(), 1) if READS.search(line)]
    assert not found, "read the setting at the entry point (cli/, integrations/) into its option object:\n" + "\n".join(found)


def test_the_environment_fills_what_is_not_given():
    env = {"FASTFEED_SHARD_CACHE": "/fast/shards", "FASTFEED_SHARD_CACHE_LIMIT": "50G",
           "FASTFEED_READ_AHEAD_SHARDS": "5", "FASTFEED_STORAGE_OPTIONS": '{"anon": true, "key": "env"}'}
    o = StoreOptions.from_env(env)
    assert (o.shard_cache, o.shard_cache_limit, o.read_ahead, o.storage_options) == ("/fast/shards", "50G", 5,
                                                                           {"anon": True, "key": "env"})
    given = StoreOptions.from_env(env, shard_cache="/mine", read_ahead=2, storage_options={"key": "mine"})
    assert (given.shard_cache, given.shard_cache_limit, given.read_ahead) == ("/mine", "50G", 2)
    assert given.storage_options == {"anon": True, "key": "mine"}            # the options given win
    assert StoreOptions.from_env({"XDG_CACHE_HOME": "/xdg"}).shard_cache == str(Path("/xdg/fastfeed/shards"))
    assert StoreOptions.from_env({}) == StoreOptions()                        # nothing set: the built-in defaults


@pytest.mark.parametrize("env,match", [
    ({"FASTFEED_READ_AHEAD_SHARDS": "two"}, "FASTFEED_READ_AHEAD_SHARDS='two': give a whole number"),
    ({"FASTFEED_READ_AHEAD_SHARDS": " ", "FASTFEED_PREFETCH_SHARDS": "two"}, "FASTFEED_PREFETCH_SHARDS='two'"),
    ({"FASTFEED_READ_AHEAD_SHARDS": "-1"}, "give a whole number of shards >= 0"),
    ({"FASTFEED_STORAGE_OPTIONS": "{anon"}, "FASTFEED_STORAGE_OPTIONS is not a JSON object"),
    ({"FASTFEED_STORAGE_OPTIONS": "[1]"}, "FASTFEED_STORAGE_OPTIONS must be a JSON object, got list"),
])
def test_a_bad_variable_is_named(env, match):
    with pytest.raises(ValueError, match=re.escape(match)):
        StoreOptions.from_env(env)


@pytest.mark.parametrize("bad", ["1.5.5G", "inf%", "nan%", "1e400M", "12Q", "G"])
def test_a_shard_cache_limit_that_is_not_a_size_is_one_line(bad, tmp_path):
    from fastfeed.store.remote.sizes import parse_size

    with pytest.raises(ValueError, match=re.escape(f"shard cache limit {bad!r} is not a size (e.g. 50G, 500M, 40%)")):
        parse_size(bad, tmp_path)


@pytest.mark.parametrize("bad", [0, -2, 1.5, True, "3"])
def test_the_retry_budget_is_a_whole_number_of_tries(bad):
    with pytest.raises(ValueError, match="retries must be a whole number of tries >= 1"):
        StoreOptions(retries=bad)


def test_the_retry_budget_bounds_the_tries_of_a_read(tmp_path):
    calls = []

    class Down:
        def cat_file(self, path, start=None, end=None):
            calls.append(path)
            raise ConnectionError("connection reset")

    with open(tmp_path / "f", "wb") as f, pytest.raises(objstore.RemoteError, match="failed 2 times"):
        objstore.download(Down(), "b/k", "s3://b/k", f.fileno(), 10, tries=2)
    assert len(calls) == 2


def test_the_cli_resolves_flags_over_the_environment(monkeypatch):
    from fastfeed.cli.common import add_remote_args, store_options

    p = argparse.ArgumentParser()
    add_remote_args(p)
    monkeypatch.setenv("FASTFEED_SHARD_CACHE_LIMIT", "7G")
    monkeypatch.setenv("FASTFEED_READ_AHEAD_SHARDS", "3")
    o = store_options(p.parse_args(["--store-retries", "2", "--read-ahead-shards", "1"]))
    assert (o.retries, o.read_ahead, o.shard_cache_limit) == (2, 1, "7G")
    assert "FASTFEED_STORE_RETRIES" not in os.environ   # nothing written into the environment
    with pytest.raises(ValueError, match="retries must be"):
        store_options(p.parse_args(["--store-retries", "0"]))
    assert "300 s" in p.format_help()   # the help says how the budget relates to the loaders' hung-worker timeout


def test_both_shard_providers_implement_the_written_protocol(tmp_path_factory):
    """`source.ShardProvider` is what a Store reads through; the Store passes its members on (`PASSED`), and
    verify reads them from the Store, never from `store.provider`."""
    from train_helpers import packed_sample

    from fastfeed import Store
    from fastfeed.store.remote.shards import RemoteShards
    from fastfeed.store.source import PASSED, RecordSource, ShardProvider

    store = Store(packed_sample(tmp_path_factory))
    assert isinstance(store.provider, ShardProvider) and isinstance(store, RecordSource)
    assert (store.remote, store.cache, store.cache_limit, store.read_ahead, store.read_ahead_given) == (
        False, None, None, None, False)
    assert store.follower() is None and store.missing() == [] and store.check_source(0) is None
    assert store.shard_entries(0) == store.shards[0].count and store.stored_bytes() > 0
    with pytest.raises(AttributeError, match="no attribute 'nothing'"):
        store.nothing   # noqa: B018
    set_in_init = RemoteShards.__init__.__code__.co_names   # a URL's needs a bucket: its members, by name
    assert not [m for m in (*PASSED, "record", "location", "close") if not hasattr(RemoteShards, m)
                and m not in set_in_init]
    assert "store.provider" not in (PACKAGE / "store" / "verify.py").read_text(encoding="utf-8")

"""The command line: exit codes, messages, and the commands the README names."""

from __future__ import annotations

import argparse
import json
import shlex
import subprocess
import sys

import pytest

from fastfeed.cli import main


def test_pack_inspect_verify_on_the_bundled_sample(tmp_path, capsys):
    out = tmp_path / "s.ff"
    assert main(["pack", "-o", str(out), "--quiet"]) == 0
    text = capsys.readouterr().out
    assert "bundled sample" in text and "16 images, 109 boxes (1 crowd)" in text
    assert main(["inspect", str(out)]) == 0
    text = capsys.readouterr().out
    assert "images 16" in text and "person" in text
    assert main(["inspect", str(out), "--json"]) == 0
    assert json.loads(capsys.readouterr().out)["images"] == 16
    assert main(["verify", str(out), "--decode", "--quiet"]) == 0
    assert "OK, 16 records checked, 16 images decoded" in capsys.readouterr().out
    assert main(["pack", "-o", str(out), "--quiet"]) == 1
    assert "--force" in capsys.readouterr().err


def test_pack_reports_problems_and_exit_codes(tmp_path, capsys, coco_builder):
    coco_builder.add_image("ok.jpg", boxes=[(1, [1, 1, 5, 5])])
    coco_builder.add_image("bad.jpg", data=b"junk")
    src = coco_builder.write()
    assert main(["pack", str(src), "-o", str(tmp_path / "a"), "--quiet", "--workers", "1"]) == 1   # 1 of 2: 50%
    assert "too much dropped: corrupt_image took 1 of the split's 2 images (50%" in capsys.readouterr().err
    assert main(["pack", str(src), "-o", str(tmp_path / "a"), "--quiet", "--workers", "1", "--max-dropped", "0.5"]) == 0
    text = capsys.readouterr().out
    assert "1 image(s) skipped" in text and "corrupt_image" in text and "bad.jpg" in text
    assert main(["pack", str(src), "-o", str(tmp_path / "b"), "--quiet", "--on-error", "fail"]) == 1
    assert "bad.jpg: corrupt_image" in capsys.readouterr().err
    assert not (tmp_path / "b").exists()
    assert main(["pack", str(src), "-o", str(tmp_path / "c"), "--max-side", "64"]) == 2
    assert "max_side applies" in capsys.readouterr().err


def test_verify_names_the_shard_whose_checksum_changed(tmp_path, capsys):
    out = tmp_path / "s.ff"
    assert main(["pack", "-o", str(out), "--quiet", "--shards", "2"]) == 0
    shard = sorted(out.glob("shard-*.mdb"))[1]
    with open(shard, "r+b") as f:   # LMDB's first page holds its meta record in its first ~150 bytes; the rest is
        f.seek(3000)                # unused: every record still reads, the file is as long, its sha256 differs
        f.write(b"x")
    capsys.readouterr()
    assert main(["verify", str(out), "--quiet"]) == 1
    lines = capsys.readouterr().out.splitlines()
    assert lines[1].startswith(f"  {shard.name}: sha256 ") and lines[1].endswith("the shard changed"), lines


def test_output_into_a_closed_pipe_ends_quietly(tmp_path):
    """`fastfeed inspect S | head -1`: the reader goes away; the command stops without a traceback."""
    import os

    out = tmp_path / "s.ff"
    assert main(["pack", "-o", str(out), "--quiet"]) == 0
    r, w = os.pipe()
    os.close(r)   # nobody will read: the first write fails (EPIPE), whenever it comes
    try:
        p = subprocess.run([sys.executable, "-m", "fastfeed", "inspect", str(out)], stdout=w, stderr=subprocess.PIPE,
                           text=True, timeout=120)
    finally:
        os.close(w)
    assert p.returncode == 141 and p.stderr == "", p.stderr


def test_an_output_whose_parent_is_not_a_folder_is_one_line(tmp_path, capsys):
    (tmp_path / "afile").write_text("x")
    assert main(["pack", "-o", str(tmp_path / "afile" / "x.ff"), "--quiet"]) == 1
    assert f"its parent folder {tmp_path / 'afile'} is a file, not a folder" in capsys.readouterr().err
    assert main(["pack", "-o", str(tmp_path / "none" / "x.ff"), "--quiet"]) == 1
    assert f"its parent folder {tmp_path / 'none'} does not exist" in capsys.readouterr().err


def test_verify_and_inspect_on_a_non_store(tmp_path, capsys):
    assert main(["verify", str(tmp_path)]) == 1
    assert "not a fastfeed store" in capsys.readouterr().err
    assert main(["inspect", str(tmp_path / "missing")]) == 1


def test_unknown_choices_and_help(capsys):
    with pytest.raises(SystemExit) as e:
        main(["pack", "-o", "x", "--store", "webp"])
    assert e.value.code == 2 and "invalid choice: 'webp'" in capsys.readouterr().err
    assert main([]) == 2
    for argv in (["verify", "x.ff"], ["cache", "build", "x.ff"]):   # was: -1 taken, one process, silently
        with pytest.raises(SystemExit) as e:
            main([*argv, "--workers", "-1"])
        assert e.value.code == 2 and "--workers: expected an integer >= 0, got '-1'" in capsys.readouterr().err


def test_python_dash_m_and_console_script(tmp_path):
    r = subprocess.run([sys.executable, "-m", "fastfeed", "pack", "--help"], capture_output=True, text=True)
    assert r.returncode == 0 and "--store {original,jpeg,raw}" in r.stdout and "YOLO" in r.stdout


def test_loaders_lists_what_runs_here(capsys):
    assert main(["loaders"]) == 0
    text = capsys.readouterr().out
    assert "cache=None, dtype='float32'" in text   # was cache=auto: None is no cache
    assert "cpu      available" in text and "options: partner_buffer=None" in text and "cache_dir='/dev/shm'" in text
    assert main(["loaders", "--json"]) == 0
    rows = {r["name"]: r for r in json.loads(capsys.readouterr().out)}
    assert rows["cpu"]["available"] and rows["shm"]["options"]["cache_partial"] is False


def _parsers(parser, name="fastfeed"):
    """Every parser of the command line by its command (`fastfeed cache ls` too)."""
    yield name, parser
    for action in parser._actions:
        if isinstance(action, argparse._SubParsersAction):
            for sub, p in action.choices.items():
                yield from _parsers(p, f"{name} {sub}")


def test_every_flag_says_what_it_does_and_its_default():
    """--help's text for each flag of every command, and for each that takes a value its default (a flag naming what
    the command works on has none). The object-storage flags state the store's own defaults."""
    from fastfeed.cli import build_parser
    from fastfeed.store.remote.shards import DEFAULT_READ_AHEAD, READ_AHEAD_BYTES, READ_AHEAD_SHARE

    inputs = {"-o", "--ann", "--images", "--data"}
    checked = 0
    for name, p in _parsers(build_parser()):
        for a in p._actions:
            if not a.option_strings or a.help == argparse.SUPPRESS or isinstance(a, argparse._HelpAction):
                continue
            assert a.help and len(a.help) > 10, (name, a.option_strings)
            if a.nargs != 0 and not inputs & set(a.option_strings):
                assert "default" in a.help, (name, a.option_strings, a.help)
            checked += 1
    assert checked > 80
    inspect = dict(_parsers(build_parser(["inspect"])))["fastfeed inspect"]
    said = " ".join(inspect.format_help().split())
    assert (f"else {READ_AHEAD_BYTES >> 20} MB of shards: at least {DEFAULT_READ_AHEAD}, at most "
            f"{READ_AHEAD_SHARE:.0%} of what the shard cache holds" in said)


def test_every_example_in_the_help_parses():
    """The command lines --help shows as examples use flags that exist, spelled as they are."""
    from fastfeed.cli import build_parser

    examples = []
    for _, p in _parsers(build_parser()):
        for line in (p.epilog or "").splitlines():
            if (cmd := line.split("#")[0].strip()).startswith(("fastfeed ", "torchrun ")):
                examples.append(shlex.split(cmd.split("-m fastfeed ")[-1].removeprefix("fastfeed ")))
    assert len(examples) >= 20
    for argv in examples:
        build_parser(argv).parse_args(argv)   # SystemExit (argparse's error) for a flag that does not exist

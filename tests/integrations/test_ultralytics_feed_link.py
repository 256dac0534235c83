"""FastfeedTrainer's feed line says what a URL store's link did (bandwidth, delay, downloads in flight); a local
store's line has no link part."""

from __future__ import annotations

import pytest

pytest.importorskip("ultralytics")

from fastfeed.integrations.ultralytics.feed import FeedClock, epoch_line  # noqa: E402


def test_the_feed_line_adds_the_link_of_a_url_store():
    row = FeedClock(0.0, 10.0, images=160, waited=0.2).row(1, "cpu")
    assert "link" not in epoch_line(row, 3)
    link = {"delay_ms": 51.5, "bandwidth_mb_s": 62.0, "per_download_mb_s": 9.4, "in_flight": 3, "most_in_flight": 9,
            "downloads": 120, "downloaded_bytes": 56 << 20, "parallel": 8}
    line = epoch_line(row, 3, link)
    assert line.startswith("fastfeed: epoch 1/3: the cpu loader fed 160 images")
    assert line.endswith("; the store's link: 62 MB/s (9.4 MB/s a download), 51.5 ms to a request's first byte, "
                         "3 downloads in flight (kept up to 8), at most 9 at once; 120 downloads, 56.0 MiB")

"""A short run of tools/soak.py against a live server: mixed requests with client cancels, and
afterwards no error, no lost request, the pools at their baseline and the memory flat."""
import sys

from server_process import API_KEY, REPO, api_server

sys.path.insert(0, str(REPO / "tools"))
from soak import soak


def test_short_soak():
    server = api_server()
    report = soak(server.url, API_KEY, n_requests=200, concurrency=8, cancel_share=0.1, seed=1,
                  warmup=16, log=lambda line: None)
    print(report)
    assert report["outcomes"]["cancelled"] > 0 and report["outcomes"]["ok"] > 150, report
    assert report["errors"] == 0 and report["lost"] == 0, report
    assert report["server_finished_completions"] == report["sent_completions"], report
    assert report["pools_at_baseline"], report
    assert report["rss_growth_mb"] < 50, report

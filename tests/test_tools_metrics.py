"""Client-side metrics of a stream, percentiles, and the tolerant reading of speculative acceptance."""
import pytest

from pyengine.tools import bisect
from pyengine.tools.client import StreamResult
from pyengine.tools.metrics import (
    acceptance_between,
    acceptance_rates,
    combined_tok_s,
    merge_acceptance,
    percentile,
    stream_metrics,
)


def test_percentile_interpolates_like_numpy():
    xs = [4.0, 1.0, 3.0, 2.0]
    assert (percentile(xs, 0), percentile(xs, 50), percentile(xs, 100)) == (1.0, 2.5, 4.0)
    assert percentile(xs, 95) == pytest.approx(3.85)
    assert percentile([], 50) is None and percentile([7.0], 99) == 7.0


def test_stream_metrics_from_chunk_times():
    # Sent at 10.0; first chunk at 10.5; 4 more 0.1 s apart; the server counted 9 tokens.
    r = StreamResult(t_send=10.0, chunk_times=[10.5, 10.6, 10.7, 10.8, 10.9], chunk_tokens=[0] * 5, t_end=11.0,
                     completion_tokens=9, finish_reason="length")  # fmt: skip
    m = stream_metrics(r)
    assert m["ttft_s"] == pytest.approx(0.5) and m["tpot_s"] == pytest.approx(0.4 / 8)
    assert m["decode_tok_s"] == pytest.approx(20.0) and m["tok_s"] == pytest.approx(9.0)
    r.completion_tokens = None  # no usage: tokens per chunk where known, else chunks
    assert stream_metrics(r)["completion_tokens"] == 5
    r.chunk_tokens = [2, 2, 2, 2, 1]
    assert stream_metrics(r)["completion_tokens"] == 9
    other = StreamResult(t_send=10.2, chunk_times=[10.4], t_end=12.0, completion_tokens=3, finish_reason="stop")
    assert combined_tok_s([r, other]) == pytest.approx(12 / 2.0)


@pytest.mark.parametrize("usage, rates", [
    ({"spec_accept_per_position": [0.9, 0.6]}, [0.9, 0.6]),
    ({"spec_accepted_per_position": [9, 3], "spec_drafted_per_position": [10, 5]}, [0.9, 0.6]),
    ({"speculative": {"accept_per_position": [0.5]}}, [0.5]),
    ({"spec": {"accepted_per_position": [1, 0], "drafted_per_position": [2, 0]}}, [0.5, None]),
    ({"completion_tokens": 3}, None), (None, None),
])  # fmt: skip
def test_acceptance_is_read_from_any_of_the_known_fields(usage, rates):
    assert acceptance_rates(usage) == rates


def test_acceptance_pools_counts_and_takes_deltas_of_counters():
    a = {"spec_accepted_per_position": [9, 3], "spec_drafted_per_position": [10, 10]}
    b = {"spec_accepted_per_position": [1, 7], "spec_drafted_per_position": [10, 10]}
    assert merge_acceptance([a, b, None]) == [0.5, 0.5]  # pooled counts, not a mean of rates
    assert merge_acceptance([{"spec_accept_per_position": [1.0]}, {"spec_accept_per_position": [0.5, 0.2]}]) \
        == [0.75, 0.2]
    after = {"spec_accepted_per_position": [10, 10], "spec_drafted_per_position": [20, 20]}
    assert acceptance_between(a, after) == [0.1, 0.7]
    assert acceptance_between(None, {"spec_accept_per_position": [0.3]}) == [0.3]
    assert acceptance_between({}, {}) is None


def test_bisect_metric_values_and_verdicts():
    cells = [{"kind": "code", "concurrency": 1, "tok_s": 100.0, "ttft_s": 0.2, "combined_tok_s": 100.0},
             {"kind": "prose", "concurrency": 1, "tok_s": 60.0, "ttft_s": 0.4, "combined_tok_s": 60.0},
             {"kind": "code", "concurrency": 2, "tok_s": 80.0, "ttft_s": 0.3, "combined_tok_s": 150.0}]
    result = {"cells": cells, "accept_per_position": [0.9, 0.7, 0.435]}
    assert bisect.metric_value(result, "tok_s") == (80.0, True)  # median over kinds at 1 stream
    assert bisect.metric_value(result, "tok_s:code") == (100.0, True)
    assert bisect.metric_value(result, "combined_tok_s") == (150.0, True)
    assert bisect.metric_value(result, "ttft") == (pytest.approx(0.3), False)
    assert bisect.metric_value(result, "accept_pos3") == (0.435, True)
    assert bisect.metric_value(result, "accept_pos4") == (None, True)
    assert bisect.verdict(0.435, 0.55, True) == 1 and bisect.verdict(0.61, 0.55, True) == 0
    assert bisect.verdict(0.2, 0.25, False) == 0 and bisect.verdict(None, 1, True) == 125
    assert bisect.check_name("accept_pos0") and bisect.check_name("tok_s:code") is None

"""The measuring commands: `pyengine bench`, `stress`, `kv-depth` and `eval`.

Each runs against any OpenAI-compatible `/v1` endpoint (`--base_url`) or in-process on a
checkpoint (`--model`), times every request on the client, prints a table, writes JSON with
`--out` and a PNG with `--plot`. Module map:

  client.py           one streamed chat request and what the client saw of it (StreamResult)
  http_client.py      that over HTTP + SSE (any OpenAI-compatible server)
  inprocess_client.py that over pyengine.LLM in this process
  metrics.py          TTFT / TPOT / ITL / tok/s of a stream, percentiles, speculative acceptance
  texts.py            the shipped prompt sets and seeded filler text for long prompts
  bench.py stress.py kv_depth.py eval_harness.py (+ sandbox.py)   the commands
  bisect.py           `--bisect-metric` / `--bisect-threshold`: exit 0 / 1 / 125 for git bisect run
  plots.py            the PNGs
  commands.py         argument parsing and dispatch (hooked into pyengine/cli.py)
"""

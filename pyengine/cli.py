"""The `pyengine` command: generate, serve.

User errors (a bad flag, a missing model, no GPU, a busy port) end in one line on stderr and
exit status 2, never a traceback; the checks run before anything slow starts.
"""

from __future__ import annotations

import argparse
import os
import sys

from . import __version__
from .cli_args import (Parser, add_engine_arguments, check_model_dir, cuda_problem, engine_kwargs,
                       fail, float_in, non_negative_int, positive_int)  # fmt: skip

PROG = "pyengine"


class _VersionAction(argparse.Action):
    """--version: the package version and what the native library was built with."""

    def __init__(self, option_strings, dest, **kwargs):
        super().__init__(option_strings, dest, nargs=0, default=argparse.SUPPRESS,
                         help="print the version and the native library's backends, then exit")

    def __call__(self, parser, namespace, values, option_string=None):
        from ._native import native
        from .errors import EngineError

        try:
            build = native().build_info
        except EngineError as exc:
            build = f"not loadable: {exc}"
        print(f"pyengine {__version__} (native library: {build})")
        parser.exit(0)


def _generate_parser(sub) -> argparse.ArgumentParser:
    g = sub.add_parser("generate", help="generate text for one prompt",
                       description="Generate text for one prompt. The answer goes to stdout; the "
                                   "reasoning (--thinking on) and a summary line go to stderr.")
    g.add_argument("--model", default=None, help="checkpoint directory (default: the embedded model)")
    g.add_argument("--prompt", required=True, help="the user message (or raw text with --raw)")
    g.add_argument("--max_tokens", type=positive_int, default=128,
                   help="most tokens to generate, reasoning included (default: 128)")
    g.add_argument("--temperature", type=float_in(0.0, 100.0), default=0.0,
                   help="sampling temperature (default 0: greedy)")
    g.add_argument("--top_p", type=float_in(0.0, 1.0, low_open=True), default=1.0,
                   help="nucleus sampling: keep the most likely tokens up to this mass (default: 1)")
    g.add_argument("--top_k", type=non_negative_int, default=0,
                   help="keep the k most likely tokens (default 0: all)")
    g.add_argument("--seed", type=non_negative_int, default=None, help="sampling seed (default: random)")
    g.add_argument("--raw", action="store_true", help="send the prompt as is, without the chat template")
    g.add_argument("--thinking", choices=["on", "off"], default="off",
                   help="let the model reason before it answers (default: off)")
    g.add_argument("--show_reasoning", choices=["on", "off"], default="on",
                   help="print the reasoning to stderr under [thinking] (default: on)")
    add_engine_arguments(g.add_argument_group("engine"))
    return g


def build_parser() -> argparse.ArgumentParser:
    parser = Parser(prog=PROG, description="Serve Qwen3.5 hybrid models or generate text from the command line.")
    parser.add_argument("--version", action=_VersionAction)
    sub = parser.add_subparsers(dest="command", required=True)
    _generate_parser(sub)
    # `pyengine serve` and the measuring tools parse their own flags (pyengine/serve.py,
    # pyengine/tools/commands.py); listed here for --help.
    sub.add_parser("serve", help="serve the OpenAI-compatible API and the chat page", add_help=False)
    from .tools import commands as tool_commands  # bench, stress, kv-depth, eval

    tool_commands.add_subparsers(sub)
    sub.metavar = "{" + ",".join(sub.choices) + "}"  # names the commands in "required" errors
    return parser


class _ReasoningPrinter:
    """Writes reasoning to stderr under a [thinking] label and the answer to stdout, so that
    `pyengine generate ... > answer.txt` keeps the answer alone."""

    def __init__(self, show_reasoning: bool):
        self.show_reasoning = show_reasoning
        self.in_reasoning = False
        self.wrote_reasoning = False
        self.wrote_content = False
        self.dim = sys.stderr.isatty()

    def write(self, reasoning: str, content: str) -> None:
        if reasoning and self.show_reasoning:
            if not self.in_reasoning:
                sys.stderr.write("[thinking]\n" + ("\x1b[2m" if self.dim else ""))
                self.in_reasoning = self.wrote_reasoning = True
            sys.stderr.write(reasoning)
            sys.stderr.flush()
        if content:
            if self.in_reasoning:
                sys.stderr.write(("\x1b[0m" if self.dim else "") + "\n[answer]\n")
                sys.stderr.flush()
                self.in_reasoning = False
            sys.stdout.write(content)
            sys.stdout.flush()
            self.wrote_content = True

    def finish(self) -> None:
        if self.in_reasoning:
            sys.stderr.write(("\x1b[0m" if self.dim else "") + "\n")
            self.in_reasoning = False
        if self.wrote_content:
            sys.stdout.write("\n")
            sys.stdout.flush()


def _generate(args: argparse.Namespace) -> int:
    from .reasoning import ReasoningParser, prompt_opens_reasoning
    from .sampling_params import SamplingParams

    prog = f"{PROG} generate"
    problem = check_model_dir(args.model)
    if problem is None and args.device == "cuda":
        problem = cuda_problem()
    if problem:
        return fail(prog, problem)
    sp = SamplingParams(max_tokens=args.max_tokens, temperature=args.temperature, top_p=args.top_p,
                        top_k=args.top_k, seed=args.seed)  # fmt: skip
    from .llm import LLM

    with LLM(args.model, device=args.device, **engine_kwargs(args)) as llm:
        prompt = args.prompt
        if not args.raw and llm._template is not None:
            prompt = llm.apply_chat_template([{"role": "user", "content": prompt}],
                                             enable_thinking=args.thinking == "on")  # fmt: skip
        reasoning = ReasoningParser(starts_in_reasoning=prompt_opens_reasoning(prompt))
        out = _ReasoningPrinter(show_reasoning=args.show_reasoning == "on")
        for ev in llm.submit(prompt=prompt, sampling_params=sp):
            out.write(*reasoning.feed(ev.text))
            if ev.finished:
                out.write(*reasoning.finish())
                out.finish()
                note = ""
                if reasoning.saw_reasoning and not out.wrote_content and ev.finish_reason == "length":
                    note = "; the answer did not start: raise --max_tokens"
                print(f"[{ev.completion_tokens} tokens, finish_reason={ev.finish_reason}{note}]",
                      file=sys.stderr)  # fmt: skip
                if ev.error:
                    return fail(prog, ev.error)
    return 0


def main(argv: list[str] | None = None) -> int:
    if argv is None:
        argv = sys.argv[1:]
    if argv[:1] == ["serve"]:
        from . import serve

        return serve.main(argv[1:])
    from .tools import commands as tool_commands

    if argv[:1] and argv[0] in tool_commands.NAMES:
        return tool_commands.main(argv)
    args = build_parser().parse_args(argv)
    from .errors import EngineError

    try:
        return _generate(args)
    except BrokenPipeError:
        # The reader of stdout left (`pyengine generate ... | head`): not an error. Point stdout
        # at /dev/null so that the interpreter's final flush does not fail again.
        os.dup2(os.open(os.devnull, os.O_WRONLY), sys.stdout.fileno())
        return 0
    except (ValueError, MemoryError, EngineError, OSError) as e:
        # ValueError covers bad checkpoints (CheckpointError) and templates; MemoryError the
        # memory plan (CapacityError); EngineError the native library's own messages.
        return fail(f"{PROG} generate", str(e))
    except KeyboardInterrupt:
        print(f"{PROG} generate: interrupted", file=sys.stderr)
        return 130


if __name__ == "__main__":
    sys.exit(main())

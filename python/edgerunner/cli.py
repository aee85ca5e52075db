"""The ``edgerunner`` command line."""

from __future__ import annotations

import argparse
import json
import os
import pathlib
import sys
from typing import Any, Sequence

from edgerunner.errors import GGUFError, ModelFetchError, OutOfMemoryError
from edgerunner.events import EventSink, LoadEvent, Stage


def _human_bytes(n: int) -> str:
    for unit in ("B", "KiB", "MiB", "GiB", "TiB"):
        if n < 1024 or unit == "TiB":
            return f"{n:.0f} {unit}" if unit == "B" else f"{n:.1f} {unit}"
        n /= 1024
    return f"{n} B"


def _human_count(n: int) -> str:
    for unit, scale in (("B", 1e9), ("M", 1e6), ("K", 1e3)):
        if n >= scale:
            return f"{n / scale:.1f}{unit}"
    return str(n)


def _print_summary(s: dict[str, Any], tensors: list | None) -> None:
    shards = f", {s['shards']} shards" if s["shards"] > 1 else ""
    print(f"file          {s['path']} ({_human_bytes(s['file_size'])}{shards}, GGUF v{s['gguf_version']})")
    print(f"architecture  {s['architecture'] or '(not set)'}" + (f"  [{s['name']}]" if s["name"] else ""))
    print(f"parameters    {_human_count(s['parameters'])} in {s['tensor_count']} tensors "
          f"({_human_bytes(s['tensor_bytes'])})")
    width = max((len(k) for k in s["hyperparameters"]), default=0) + 2
    for key, value in s["hyperparameters"].items():
        print(f"  {key:<{width}}{value}")
    print("tensor types")
    for name, t in s["tensor_types"].items():
        print(f"  {name:<8}{t['count']:>6} tensors  {_human_bytes(t['bytes']):>10}")
    tok = s["tokenizer"]
    if tok["model"]:
        pre = f", pre-tokenizer {tok['pre']}" if tok["pre"] else ""
        print(f"tokenizer     {tok['model']}, {tok['vocab_size']} tokens{pre}")
    else:
        print("tokenizer     (none in the file)")
    print(f"chat template {'present' if s['chat_template'] else 'absent'}")
    if tensors is not None:
        print("tensors")
        for t in tensors:
            shape = "x".join(str(d) for d in t.shape)
            print(f"  {t.name:<40}{t.type_name:<8}{shape:>20}  {_human_bytes(t.n_bytes):>10}")


class LoadProgress:
    """Shows load events on stderr. On a terminal (stdout and stderr both), a tqdm bar per stage
    with bytes, rate and ETA; otherwise nothing but the download messages, one line each."""

    def __init__(self, bars: bool | None = None):
        self.bars = sys.stdout.isatty() and sys.stderr.isatty() if bars is None else bars
        self.stage: Stage | None = None
        self.message = ""
        self.bar: Any = None

    def __call__(self, event: LoadEvent) -> None:
        if event.stage != self.stage:
            self.close()
            self.stage = event.stage
            complete = event.total is not None and event.done >= event.total
            if self.bars and event.stage in (Stage.DOWNLOADING, Stage.LOADING) and not complete:
                from tqdm import tqdm

                self.bar = tqdm(total=event.total, unit="B", unit_scale=True, unit_divisor=1024, file=sys.stderr,
                                desc=event.stage.value, leave=event.stage is Stage.DOWNLOADING, dynamic_ncols=True)
        if event.stage is Stage.DOWNLOADING and event.message != self.message:
            self.message = event.message
            if self.bar is not None:
                self.bar.write(f"edgerunner: {event.message}", file=sys.stderr)
            else:
                _say(event.message)
        if self.bar is not None:
            if event.total is not None and self.bar.total != event.total:
                self.bar.total = event.total
            self.bar.update(event.done - self.bar.n)
        if event.stage in (Stage.READY, Stage.FAILED):
            self.close()

    def close(self) -> None:
        if self.bar is not None:
            self.bar.close()
            self.bar = None


def _fetch(source: str | None, revision: str | None = None) -> pathlib.Path:
    """A model source as a local file, downloads shown as ``pull`` shows them."""
    from edgerunner import sources

    progress = LoadProgress()
    events = EventSink(progress)
    try:
        return sources.resolve(source, revision=revision,
                               report=lambda done, total, message: events.emit(Stage.DOWNLOADING, done, total, message))
    finally:
        progress.close()


def cmd_info(args: argparse.Namespace) -> int:
    from edgerunner import gguf

    f = gguf.open(_fetch(args.model, args.revision))
    summary = f.summary()
    if args.json:
        if args.tensors:
            summary["tensors"] = [
                {"name": t.name, "type": t.type_name, "shape": list(t.shape), "offset": t.offset, "bytes": t.n_bytes}
                for t in f.tensors
            ]
        print(json.dumps(summary, indent=2))
    else:
        _print_summary(summary, f.tensors if args.tensors else None)
    return 0


def _backend(name: str) -> str:
    from edgerunner.model import is_backend

    if not is_backend(name):
        raise argparse.ArgumentTypeError(f"unknown backend {name!r}: choose auto, cpu, cuda, cuda:N (CUDA device N) or metal")
    return name


def _count(low: int):
    def parse(text: str) -> int:
        try:
            value = int(text)
        except ValueError:
            raise argparse.ArgumentTypeError(f"{text!r} is not a whole number") from None
        if value < low:
            raise argparse.ArgumentTypeError(f"{value} is less than {low}")
        return value
    return parse


def _add_generation_args(p: argparse.ArgumentParser) -> None:
    g = p.add_argument_group("generation")
    g.add_argument("-n", "--max-tokens", type=int, default=256, help="most tokens to generate (default 256)")
    g.add_argument("--temperature", type=float, default=0.8, help="0 = greedy (default 0.8)")
    g.add_argument("--top-k", type=int, default=40, help="0 = off (default 40)")
    g.add_argument("--top-p", type=float, default=0.95, help="1 = off (default 0.95)")
    g.add_argument("--min-p", type=float, default=0.05, help="0 = off (default 0.05)")
    g.add_argument("--repeat-penalty", type=float, default=1.0, help="1 = off (default 1.0)")
    g.add_argument("--seed", type=int, default=None, help="fixed seed: the same text every run")
    g.add_argument("--stop", action="append", default=[], help="stop string (repeatable)")
    _add_model_args(p)


def _add_model_args(p: argparse.ArgumentParser, context: bool = True) -> None:
    """The load options; `context`: also --n-ctx and --precise (bench sizes its own context and
    measures the fast mode)."""
    m = p.add_argument_group("model")
    if context:
        m.add_argument("--n-ctx", type=int, default=None, help="context length (default: the model's, at most 4096)")
    m.add_argument("--threads", type=int, default=None, help="CPU threads (default: all)")
    m.add_argument("--kv-type", default="f16", choices=["f16", "f32", "q8_0"], help="KV cache precision")
    if context:
        m.add_argument("--precise", action="store_true", help="float32 activations and KV cache (slower)")
    m.add_argument("--backend", default="auto", type=_backend, metavar="{auto,cpu,cuda,cuda:N,metal}",
                   help="where to run (default auto: a GPU backend when this build has one and a GPU is present; "
                        "cuda:N: CUDA device N)")
    m.add_argument("--revision", default=None, help="hub models: the branch, tag or commit (default main)")


def _load(args: argparse.Namespace, source: str | None):
    from edgerunner import Model

    progress = LoadProgress()
    try:
        return Model.load(source, revision=args.revision, on_event=progress, n_ctx=args.n_ctx, threads=args.threads,
                          kv_type=args.kv_type, precise=args.precise, backend=args.backend)
    finally:
        progress.close()


def cmd_pull(args: argparse.Namespace) -> int:
    from edgerunner import gguf

    path = _fetch(args.model, args.revision)
    print(f"{args.model}\t{_human_bytes(gguf.open(path).file_size)}\t{path}")  # every shard counted
    return 0


def cmd_list(args: argparse.Namespace) -> int:
    from edgerunner import builtin_models, hub

    rows = []
    for alias, model in sorted(builtin_models.ALIASES.items()):
        path = builtin_models.cache_dir() / model.file_name
        if path.is_file():
            rows.append((alias, path.stat().st_size, "built-in", str(path)))
    for model in hub.cached_models():
        rows.append((model.name, model.size, f"hub {model.revision}", str(model.path)))
    for repo_id, size in hub.partial_downloads():
        rows.append((repo_id, size, "hub, partial download (edgerunner pull resumes it)", ""))
    if args.json:
        print(json.dumps([{"model": n, "size": b, "source": w, "path": p} for n, b, w, p in rows], indent=2))
        return 0
    if not rows:
        _say(f"no models cached yet (built-in cache {builtin_models.cache_dir()}, hub cache {hub.cache_dir()}); "
             "fetch one with: edgerunner pull MODEL")
        return 0
    width = max(len(r[0]) for r in rows) + 2
    print(f"{'MODEL':<{width}}{'SIZE':>10}  SOURCE")
    for name, size, where, _ in rows:
        print(f"{name:<{width}}{_human_bytes(size):>10}  {where}")
    return 0


def cmd_rm(args: argparse.Namespace) -> int:
    from edgerunner import builtin_models, hub, sources

    for model in args.models:
        if model in builtin_models.ALIASES:
            freed = builtin_models.remove(model)
        else:
            name = sources.hub_name(model)
            if name is None:
                raise ValueError(f"{model!r} is not a cached model name: rm takes a built-in name or a hub name "
                                 "(org/repo, org/repo:TAG, org/repo/file.gguf); delete local files yourself")
            freed = hub.remove(name)
        print(f"removed {model} ({_human_bytes(freed)})")
    return 0


def _sampling(args: argparse.Namespace) -> dict[str, Any]:
    return dict(max_tokens=args.max_tokens, temperature=args.temperature, top_k=args.top_k, top_p=args.top_p,
                min_p=args.min_p, repetition_penalty=args.repeat_penalty, seed=args.seed, stop=args.stop)


def cmd_run(args: argparse.Namespace) -> int:
    if len(args.words) > 2:
        raise SystemExit("edgerunner run: give at most a model and one prompt (quote the prompt)")
    source, prompt = (None, args.words[0]) if len(args.words) == 1 else args.words
    if source is None:
        _say("using the built-in default model (smollm2-135m-instruct); name a .gguf or a hub model (org/repo:Q4_K_M) to use another")
    model = _load(args, source)
    if args.raw or model.chat_template is None:
        pieces = model.generate(prompt, stream=True, **_sampling(args))
    else:
        pieces = model.chat([{"role": "user", "content": prompt}], stream=True, **_sampling(args))
    for piece in pieces:
        sys.stdout.write(piece)
        sys.stdout.flush()
    sys.stdout.write("\n")
    return 0


def cmd_chat(args: argparse.Namespace) -> int:
    model = _load(args, args.model)
    conversation = model.session(system=args.system)
    fallback = model.chat_template is None
    if fallback:
        _say("this model has no chat template: using a generic ChatML template")
    interactive = sys.stdin.isatty()
    if interactive:
        _say("chatting with " + os.path.basename(model.path) + " (Ctrl-D or /exit to quit, /reset to start over)")
    while True:
        try:
            line = input("> " if interactive else "")
        except EOFError:
            break
        text = line.strip()
        if not text:
            continue
        if text in ("/exit", "/quit"):
            break
        if text == "/reset":
            conversation.reset()
            continue
        for piece in conversation.send(text, stream=True, template_fallback=fallback, **_sampling(args)):
            sys.stdout.write(piece)
            sys.stdout.flush()
        sys.stdout.write("\n")
        sys.stdout.flush()
    return 0


def cmd_serve(args: argparse.Namespace) -> int:
    import signal

    from edgerunner.server import Server

    def stop(signum: int, frame: Any) -> None:
        raise KeyboardInterrupt  # (SIGTERM, a service manager's stop, ends the server as Ctrl-C does)

    if args.model is None:
        _say("serving the built-in default model (smollm2-135m-instruct); name a .gguf or a hub model to serve another")
    model = _load(args, args.model)
    if model.chat_template is None:
        _say("this model has no chat template: chat requests use a generic ChatML template")
    server = Server(model, args.host, args.port, log=True, api_key=args.api_key or os.environ.get("EDGERUNNER_API_KEY"))
    _say(f"serving {server.name} ({model.device}) on {server.url}: POST /v1/chat/completions, /v1/completions; "
         "GET /v1/models, /health (Ctrl-C stops)")
    signal.signal(signal.SIGTERM, stop)
    try:
        server.serve_forever()
    except KeyboardInterrupt:
        _say("stopped")
    finally:
        server.server_close()
    return 0


def cmd_bench(args: argparse.Namespace) -> int:
    from edgerunner import _core, sources
    from edgerunner.benchmark import measure

    _core.Model.check_options(kv_type=args.kv_type, backend=args.backend)  # (before a download)
    if args.model is None:
        _say("measuring the built-in default model (smollm2-135m-instruct); name a .gguf or a hub model to measure another")
    path = str(sources.resolve(args.model, revision=args.revision))
    name = os.path.basename(path)
    _say(f"measuring {name}: a {args.pp}-token prompt and {args.tg} generated tokens, "
         f"{args.reps} time{'s' if args.reps != 1 else ''} after a warm-up")
    result = measure(path, pp=args.pp, tg=args.tg, depth=args.depth, reps=args.reps, threads=args.threads or 0,
                     kv_type=args.kv_type, backend=args.backend)
    if args.json:
        print(json.dumps({"model": name, **result}, indent=2))
        return 0
    at = f" at depth {args.depth}" if args.depth else ""
    where = result["device"] + (f", {args.threads or os.cpu_count()} threads, {result['isa']}" if result["device"] == "cpu" else "")
    print(f"{name} on {where}{at}")
    for key, what in (("pp", f"prompt of {args.pp} tokens"), ("tg", f"{args.tg} tokens generated, greedy")):
        s = result[key]
        print(f"  {key}{getattr(args, key)}: {s['mean']:9.1f} ± {s['std']:.1f} tok/s   ({what})")
    print(f"  memory: {result['rss_after_load'] / 2**20:.0f} MiB resident after load (KV cache {result['kv_bytes'] / 2**20:.1f} MiB)")
    return 0


def cmd_devices(args: argparse.Namespace) -> int:
    from edgerunner import devices

    found = devices()
    if args.json:
        print(json.dumps(found, indent=2))
        return 0
    auto = next((d["device"] for d in found if d["available"] and d["device"] != "cpu"), "cpu")
    for d in found:
        state = "" if d["available"] else "not available: "
        print(f"{d['device']:<8} {state}{d['description']}")
    print(f"\n--backend auto picks {auto}" + (" (cpu with --precise)" if auto != "cpu" else ""))
    return 0


def _say(message: str) -> None:
    print(f"edgerunner: {message}", file=sys.stderr)


_MODEL_HELP = "a .gguf path, a built-in name, or a hub name: org/repo, org/repo:Q4_K_M, org/repo/file.gguf"


def build_parser() -> argparse.ArgumentParser:
    parser = argparse.ArgumentParser(prog="edgerunner", description="Fast local LLM inference over GGUF models.")
    sub = parser.add_subparsers(dest="command", metavar="COMMAND")
    info = sub.add_parser("info", help="describe a GGUF model: architecture, sizes, tensor types, tokenizer")
    info.add_argument("model", help=_MODEL_HELP)
    info.add_argument("--json", action="store_true", help="print JSON instead of text")
    info.add_argument("--tensors", action="store_true", help="also list every tensor")
    info.add_argument("--revision", default=None, help="hub models: the branch, tag or commit (default main)")
    info.set_defaults(func=cmd_info)

    pull = sub.add_parser("pull", help="download a model into the cache (resumes an interrupted download)")
    pull.add_argument("model", help=_MODEL_HELP)
    pull.add_argument("--revision", default=None, help="hub models: the branch, tag or commit (default main)")
    pull.set_defaults(func=cmd_pull)

    ls = sub.add_parser("list", help="list the cached models with their sizes")
    ls.add_argument("--json", action="store_true", help="print JSON instead of a table")
    ls.set_defaults(func=cmd_list)

    rm = sub.add_parser("rm", help="delete cached models",
                        description="edgerunner rm MODEL...: org/repo deletes the whole cached repo, "
                                    "org/repo:TAG or org/repo/file.gguf that model's files.")
    rm.add_argument("models", nargs="+", metavar="MODEL", help="a built-in name or a hub name, as `list` shows it")
    rm.set_defaults(func=cmd_rm)

    run = sub.add_parser("run", help="generate a reply to one prompt, streamed",
                         description="edgerunner run [MODEL] PROMPT: with no MODEL, the built-in default model.")
    run.add_argument("words", nargs="+", metavar="[MODEL] PROMPT", help="a model (" + _MODEL_HELP + "), then the prompt")
    run.add_argument("--raw", action="store_true", help="continue the prompt as plain text (no chat template)")
    _add_generation_args(run)
    run.set_defaults(func=cmd_run)
    parser.set_defaults(run_parser=run)  # (main: its options between the model and the prompt)

    chat = sub.add_parser("chat", help="interactive chat that keeps the conversation")
    chat.add_argument("model", nargs="?", default=None, help=_MODEL_HELP + " (default: the built-in default)")
    chat.add_argument("--system", default=None, help="system message")
    _add_generation_args(chat)
    chat.set_defaults(func=cmd_chat)

    serve = sub.add_parser("serve", help="serve a model over HTTP with the OpenAI API (chat and text completions)")
    serve.add_argument("model", nargs="?", default=None, help=_MODEL_HELP + " (default: the built-in default)")
    serve.add_argument("--host", default="127.0.0.1", help="address to listen on (default 127.0.0.1: this machine only)")
    serve.add_argument("--port", type=int, default=8080, help="port (default 8080; 0: a free one)")
    serve.add_argument("--api-key", default=None, help="require 'Authorization: Bearer KEY' on /v1 requests "
                                                       "(default: $EDGERUNNER_API_KEY, else none)")
    _add_model_args(serve)
    serve.set_defaults(func=cmd_serve)

    bench = sub.add_parser("bench", help="measure prefill and decode speed (tokens/s) of a model here, as llama-bench does")
    bench.add_argument("model", nargs="?", default=None, help=_MODEL_HELP + " (default: the built-in default)")
    bench.add_argument("--pp", type=_count(1), default=512, help="prompt tokens evaluated at once (default 512)")
    bench.add_argument("--tg", type=_count(1), default=128, help="tokens generated one at a time (default 128)")
    bench.add_argument("--depth", type=_count(0), default=0, help="tokens already in the context when each starts (default 0)")
    bench.add_argument("--reps", type=_count(1), default=3, help="repetitions after a warm-up (default 3)")
    bench.add_argument("--json", action="store_true", help="print JSON instead of text")
    _add_model_args(bench, context=False)
    bench.set_defaults(func=cmd_bench)

    devs = sub.add_parser("devices", help="list what this build can run on here: the CPU, CUDA devices (cuda:N), Metal")
    devs.add_argument("--json", action="store_true", help="print JSON instead of text")
    devs.set_defaults(func=cmd_devices)
    return parser


def main(argv: Sequence[str] | None = None) -> int:
    parser = build_parser()
    argv = list(sys.argv[1:] if argv is None else argv)
    args, extra = parser.parse_known_args(argv)
    if extra and getattr(args, "func", None) is cmd_run:
        # `run MODEL --seed 3 PROMPT`: options between the positionals, which parse_args would
        # leave after the model (its words end at the first option), parsed intermixed
        args = args.run_parser.parse_intermixed_args(argv[argv.index("run") + 1:])
    elif extra:
        parser.parse_args(argv)  # (the error for the unrecognized arguments)
    if not getattr(args, "func", None):
        parser.print_help()
        return 2
    try:
        return args.func(args)
    except BrokenPipeError:  # the reader (e.g. `| head`) stopped reading: not an error of ours
        os.dup2(os.open(os.devnull, os.O_WRONLY), sys.stdout.fileno())
        return 1
    except (GGUFError, OSError, ValueError, ModelFetchError, OutOfMemoryError) as e:
        print(f"edgerunner: error: {e}", file=sys.stderr)
        return 1
    except KeyboardInterrupt:
        if args.func in (cmd_pull, cmd_run, cmd_chat, cmd_info):
            _say("interrupted; a partial download is kept and the same command resumes it")
        return 130


if __name__ == "__main__":
    sys.exit(main())

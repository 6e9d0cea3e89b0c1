"""`calculet serve [CALBIN|SOURCE]`: the OpenAI-compatible HTTP server."""

from __future__ import annotations

from calculet.server.config import ServerConfig  # its field defaults are the flags' defaults


def add_parser(sub) -> None:
    p = sub.add_parser("serve", help="serve a calbin (or a source, compiled into the cache once) over an OpenAI-compatible API")
    p.add_argument("model", nargs="?", default=None, metavar="CALBIN|SOURCE",
                   help="a calbin, HF folder or .gguf file (omit for the embedded default model)")
    p.add_argument("--host", default=ServerConfig.host)
    p.add_argument("--port", type=int, default=ServerConfig.port)
    p.add_argument("--api-key", default=None, help="require `Authorization: Bearer KEY` on /v1 and admin routes")
    p.add_argument("--max-queue", type=int, default=ServerConfig.max_queue,
                   help="requests (choices) that may wait for a lane; more get 429 (default %(default)s)")
    p.add_argument("--max-prefill-tokens", type=int, default=ServerConfig.max_prefill_tokens, metavar="N",
                   help="prompt tokens prefilled per engine step, in chunks (at least one chunk); higher: better "
                        "throughput and TTFT under bursts, lower: steadier inter-token latency (default %(default)s)")
    p.add_argument("--request-timeout", type=float, default=None, metavar="S", help="fail a request after S seconds")
    p.add_argument("--served-model-name", default=None, help="the model id clients send (default: from the path)")
    p.add_argument("--threads", type=int, default=ServerConfig.threads, help="ONNX Runtime intra-op threads (0 = all cores)")
    p.add_argument("--chat-template", default=None, metavar="NAME|FILE",
                   help="chat template for /v1/chat/completions: a built-in (gemma, chatml, qwen, llama3) or a Jinja "
                        "file (default: the model's own, else the built-in for its family)")
    p.add_argument("--max-body-bytes", type=int, default=None, metavar="N",
                   help="largest request body; bigger ones get 413 before they are read (default: max(1 MiB, 64 B x "
                        "context), enough for a full context of text)")
    p.add_argument("--drain-timeout", type=float, default=30.0, metavar="S",
                   help="on SIGTERM/Ctrl-C: stop admitting (503), let running requests finish for up to S seconds, then "
                        "end the rest with an error event (default 30)")
    p.add_argument("--job-timeout", type=float, default=ServerConfig.job_timeout_s, metavar="S",
                   help="a device job running longer than S seconds counts as hung: its requests fail with a device "
                        "error and a fresh worker takes over (default %(default)s)")
    from calculet.runtime.providers import add_provider_arguments

    add_provider_arguments(p)
    p.set_defaults(func=serve)


def serve(args) -> int:
    from calculet.runtime.providers import parse_provider_options
    from calculet.server.runner import run_server

    config = ServerConfig(model=args.model, host=args.host, port=args.port, api_key=args.api_key,
                          max_queue=args.max_queue, max_prefill_tokens=args.max_prefill_tokens, request_timeout_s=args.request_timeout,
                          served_model_name=args.served_model_name, threads=args.threads,
                          chat_template=args.chat_template, provider=args.provider,
                          provider_options=parse_provider_options(args.provider_option), max_body_bytes=args.max_body_bytes,
                          drain_timeout_s=args.drain_timeout, job_timeout_s=args.job_timeout)
    return run_server(config)

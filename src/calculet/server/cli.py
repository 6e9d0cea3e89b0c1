"""`calculet serve [[NAME=]CALBIN|SOURCE ...]`: the OpenAI-compatible HTTP server, over one model or
several (`--models models.toml`, server/model_spec.py), each on its chip (server/placement.py)."""

from __future__ import annotations

from calculet.server.config import ServerConfig  # its field defaults are the flags' defaults


def add_parser(sub) -> None:
    p = sub.add_parser("serve", help="serve a calbin (or a source, compiled into the cache once) over an OpenAI-compatible API")
    add_server_arguments(p)
    p.set_defaults(func=serve)


def add_server_arguments(p) -> None:
    """The flags that build a ServerConfig (shared with `calculet ray serve`, whose replicas each run one)."""
    p.add_argument("model", nargs="*", default=[], metavar="[NAME=]CALBIN|SOURCE",
                   help="calbins, HF folders or .gguf files to serve, each as NAME=PATH or PATH (its name is then "
                        "derived from the path); omit for the embedded default model")
    p.add_argument("--models", default=None, metavar="TOML",
                   help="serve the [[model]] tables of this file (name, source or calbin, chips, lanes, chat_template, "
                        "max_queue, max_prefill_tokens, request_timeout); keys left out take the flags' values")
    p.add_argument("--chips", type=int, default=ServerConfig.chips, metavar="N",
                   help="chips to place models on; each model runs on its own sessions and worker with cores/N "
                        "threads (unless --threads) (default %(default)s)")
    p.add_argument("--partition", default="", choices=("", "tp", "pp", "ep"), metavar="tp|pp|ep",
                   help="compile a source (or the default model) for --chips chips, split by tensor (tp), pipeline "
                        "(pp) or, for mixture-of-experts models, expert (ep) parallelism, and serve it on them; a calbin compiled with --chips N --partition runs on "
                        "chips 0..N-1 without this flag (default: one chip)")
    p.add_argument("--chip-memory", default=None, metavar="BYTES",
                   help="memory budget of each chip (e.g. 512M, 8G); a model whose memory plan does not fit is refused "
                        "(default: unlimited)")
    p.add_argument("--admin-key", default=None,
                   help="key of the admin endpoints (/admin/models: load, unload, reload); default: --api-key; with "
                        "neither they are off")
    p.add_argument("--host", default=ServerConfig.host)
    p.add_argument("--port", type=int, default=ServerConfig.port)
    p.add_argument("--api-key", default=None, help="require `Authorization: Bearer KEY` on /v1 and admin routes")
    p.add_argument("--max-queue", type=int, default=ServerConfig.max_queue,
                   help="requests (choices) that may wait for a lane; more get 429 (default %(default)s)")
    p.add_argument("--max-prefill-tokens", type=int, default=ServerConfig.max_prefill_tokens, metavar="N",
                   help="prompt tokens prefilled per engine step, in chunks (at least one chunk); higher: better "
                        "throughput and TTFT under bursts, lower: steadier inter-token latency (default %(default)s)")
    p.add_argument("--step-token-budget", type=int, default=ServerConfig.step_token_budget, metavar="N",
                   help="while sequences decode, decode rows + prompt tokens per engine step (mixed steps: prompts are "
                        "prefilled in chunks that fit beside the decode rows); lower: steadier inter-token latency, "
                        "higher: lower TTFT; 0: no such budget, only --max-prefill-tokens (default %(default)s)")
    p.add_argument("--ttft-target", type=float, default=ServerConfig.ttft_target_s, metavar="SECONDS",
                   help="while sequences decode, a step prefills more than --step-token-budget allows when a waiting "
                        "prompt would otherwise get its first token later than this (from the step costs measured as "
                        "the server runs); decoding streams then pay longer steps (default: off, the budget alone decides)")
    p.add_argument("--burst-prefill-tokens", type=int, default=ServerConfig.burst_prefill_tokens, metavar="N",
                   help="prompts that arrive while nothing decodes are prefilled at full speed before any of them "
                        "decodes, while at most N of their prompt tokens are left (each stream sends its first token, "
                        "then waits once; the burst then decodes in step, as llama.cpp batches it); 0: off, each "
                        "stream decodes as soon as it is prefilled (default %(default)s)")
    p.add_argument("--in-flight", type=int, choices=(1, 2), default=ServerConfig.in_flight,
                   help="device jobs queued at once: 1 waits for each job before the next, 2 (ping/pong) samples and "
                        "streams one job's tokens while the device runs the next (default %(default)s)")
    p.add_argument("--request-timeout", type=float, default=None, metavar="S", help="fail a request after S seconds")
    p.add_argument("--served-model-name", default=None, help="the model id clients send (default: from the path)")
    p.add_argument("--threads", type=int, default=ServerConfig.threads, help="ONNX Runtime intra-op threads (0 = all cores)")
    p.add_argument("--ort-spinning", choices=("run", "off"), default=ServerConfig.spinning,
                   help="how ONNX Runtime's pool threads wait between kernels: run = spin within a device job and "
                        "stop when it ends (faster steps: the cores stay awake between kernels); off = sleep whenever "
                        "idle (for cores shared with other busy processes) (default %(default)s)")
    p.add_argument("--hugepages", choices=("collapse", "off"), default=ServerConfig.hugepages,
                   help="once the model is loaded, move its weights and ONNX Runtime's buffers onto 2 MiB transparent "
                        "huge pages (Linux 6.1+, MADV_COLLAPSE: fewer TLB misses when a decode step streams the "
                        "weights; takes ~2 s at load for the default model); off keeps 4 KiB pages (default %(default)s)")
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
    p.add_argument("--no-prefix-cache", dest="prefix_cache", action="store_false",
                   help="do not keep finished sequences' KV for reuse: every prompt is prefilled in full (default: a "
                        "prompt that starts like a finished one resumes from its lane's KV)")
    p.add_argument("--kv-dtype", default=ServerConfig.kv_dtype, choices=("fp32", "fp16", "bf16", "int8"),
                   help="KV cache dtype when a source is compiled at start (as `calculet compile --kv-dtype`; a calbin "
                        "keeps the one it was compiled with): fp16 halves the KV bytes (default %(default)s)")
    from calculet.runtime.providers import add_provider_arguments

    add_provider_arguments(p)


def server_config(args) -> ServerConfig:
    """The ServerConfig of flags added by add_server_arguments (models from the arguments or --models)."""
    from calculet.runtime.providers import parse_provider_options

    from calculet.server.model_spec import ModelSpec, from_argument, read_models_toml
    from calculet.server.placement import parse_bytes

    if args.models and args.model:
        from calculet.errors import RequestError
        raise RequestError("bad_option", "give models either on the command line or with --models, not both")
    if len(args.model) > 1 and args.served_model_name:
        from calculet.errors import RequestError
        raise RequestError("bad_option", "--served-model-name names one model; with several, write NAME=PATH")
    single = args.model[0] if len(args.model) == 1 else None
    config = ServerConfig(model=single, host=args.host, port=args.port, api_key=args.api_key,
                          max_queue=args.max_queue, max_prefill_tokens=args.max_prefill_tokens,
                          step_token_budget=args.step_token_budget,
                          burst_prefill_tokens=args.burst_prefill_tokens, ttft_target_s=args.ttft_target or None,
                          in_flight=args.in_flight, request_timeout_s=args.request_timeout,
                          served_model_name=args.served_model_name, threads=args.threads, spinning=args.ort_spinning, hugepages=args.hugepages,
                          chat_template=args.chat_template, provider=args.provider,
                          provider_options=parse_provider_options(args.provider_option), max_body_bytes=args.max_body_bytes,
                          drain_timeout_s=args.drain_timeout, job_timeout_s=args.job_timeout, chips=args.chips,
                          partition=args.partition,
                          chip_memory=parse_bytes(args.chip_memory) if args.chip_memory else None,
                          admin_key=args.admin_key, prefix_cache=args.prefix_cache, kv_dtype=args.kv_dtype)
    specs: tuple[ModelSpec, ...] = ()
    if args.models:
        specs = read_models_toml(args.models, config.model_spec())
    elif len(args.model) == 1 and "=" in args.model[0]:
        specs = (from_argument(args.model[0], config.model_spec()),)
    elif len(args.model) > 1:
        specs = tuple(from_argument(a, config.model_spec()) for a in args.model)
    if specs:
        from dataclasses import replace
        config = replace(config, model=None, models=specs)
    return config


def serve(args) -> int:
    from calculet.server.runner import run_server

    return run_server(server_config(args))

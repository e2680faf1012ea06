"""Serve a `verifiers` environment to agent-r1 as an agent service.

agent-r1 trains agents that talk to an OpenAI-compatible endpoint (docs/openai-endpoint.md).
This module turns an environment written with `verifiers` (0.4.0, the `verifiers.v1` API:
a `Taskset` of `Task`s scored by `@vf.reward` / `@vf.metric` methods, `Toolset` tool
servers, an `Env` playing agents on the tasks) into an *agent service*: one long-lived
process that plays one episode per POST against agent-r1's endpoint and answers with the
reward the environment scores.

Usage (agent-r1 starts it as a command; the first line on stdout is the URL to POST to)::

    python python/agent_r1_verifiers.py --env ENV [--env-args JSON] [--env-config JSON]
        [--max-tokens N] [--model NAME] [--listen 127.0.0.1:0]

`ENV` is one of

- a Python file, `path/to/env.py[:FUNCTION]`, or a module, `pkg.module:FUNCTION`: FUNCTION
  (`load_environment` by default) is called with the `--env-args` object as keyword
  arguments and returns a `vf.Env` (what `vf.load_environment(config)` returns), a
  `vf.EnvConfig`, or a dict of one. A file or module without that function but exporting a
  `vf.Taskset` subclass in `__all__` is a taskset, as below.
- an installed taskset id (a package exporting its `vf.Taskset` subclass in `__all__`, e.g.
  one from the Environments Hub): the env is `vf.load_environment` of
  `{"taskset": {"id": ENV, **env_args}}`.

`--env-config` is merged, key by key, into the env's config before it is built, e.g.
`'{"agent": {"max_turns": 4}}'`.

The protocol (agent-r1's side is `actors/src/endpoint/external_agent.rs`): each episode is
one `POST /` with `{"task": {"id", "data_source", "question", "answers", "extra"?},
"base_url", "api_key", "episode_base_url"}`; the answer is `200 {"reward": float, "metrics":
{name: number}}`, or `500` with a one-line reason (agent-r1 then fails the episode and
tries it once more). `GET /` answers `ok`. The process serves until it is killed.

How an episode runs:

- The task becomes a task of the env's own `Task` class: each field of its `TaskData` class
  is taken from `task.extra` when present there, else `prompt` from `task.prompt` or
  `task.question`, `question`, `answer` (`answers[0]`), `answers` and `id` from the task.
  `--export-tasks FILE` writes an env's own tasks as agent-r1 JSONL rows that map back to
  the same tasks.
- `Env.run_episode` plays it inside `Env.serving()` (entered once: shared tool servers and
  the interception server live as long as the service). An agent seat left on the
  defaults gets the subprocess runtime (not a Prime sandbox) and, where its harness would be
  the uv-installed `bash` program, `AgentR1Harness`: an in-process chat loop that offers
  the model the env's tools (its MCP `Toolset`s), runs the calls the model makes, and ends
  on a reply without calls, or when the env's limits (`max_turns`, ...) refuse a turn.
- Every model call goes harness -> verifiers' interception server (which records the trace
  the rewards read) -> this service's `/upstream` relay -> agent-r1's endpoint, under the
  episode's key. The relay exists because verifiers keeps one HTTP client per endpoint
  config for the life of its interception server: one config (the relay) serves every
  episode, and the relay finds the episode by the `X-Session-ID` header verifiers sends
  (the agent run's trace id).
- Requests carry what the harness sends (`model`, `messages`, `tools` when the env has
  tools) plus the seat's sampling: `max_tokens` from `--max-tokens`, and `temperature` /
  `top_p` only if the env pins them (agent-r1 refuses values other than the run's).
- `reward` is the mean of the trainable runs' `trace.reward` (the weighted sum of the
  `@vf.reward` scores; one run in a single-agent env); `metrics` hold each reward
  function's score and each metric (means over those runs), plus `turns`, the model calls
  the episode made. No `step_rewards` are sent: every step of the episode, whichever agent
  run made it, is trained on the episode's reward.
"""

from __future__ import annotations

import argparse
import asyncio
import contextlib
import importlib
import importlib.util
import json
import logging
import math
import os
import signal
import sys
from pathlib import Path
from typing import Any

if __name__ == "__main__":
    # verifiers resolves a harness by importing its id as a module: run as a script, this
    # file hands over to that module, so one copy holds the classes and the state.
    sys.path.insert(0, os.path.dirname(os.path.abspath(__file__)))
    from agent_r1_verifiers import main

    sys.exit(main())

import aiohttp
from aiohttp import web

import verifiers.v1 as vf
from verifiers.v1.dialects.chat import message_to_wire
from verifiers.v1.harnesses.utils.mcp import mcp_content_to_chat_content

__all__ = ["AgentR1Harness", "AgentR1HarnessConfig", "main"]

HARNESS_ID = "agent_r1_verifiers"
"""The harness id a seat names to run `AgentR1Harness` (this module's import name)."""
NO_KEY_VAR = "AGENT_R1_VERIFIERS_UNUSED_KEY"
"""verifiers reads the endpoint's key from this (unset) variable; the relay sets the real one."""

log = logging.getLogger("agent_r1_verifiers")

# HTTP clients for the process, created in `serve()` (the harness opens its own when used
# outside this service): `_http` for model calls (harness -> interception, relay ->
# agent-r1), `_mcp_http` for tool servers. Shared, because a new client per episode costs a
# TLS context (~20 ms of CPU) even for plain-HTTP localhost servers.
_http: aiohttp.ClientSession | None = None
_mcp_http: Any = None
MCP_TIMEOUT = 600.0


def _new_http() -> aiohttp.ClientSession:
    # No connection cap: every episode in flight has a request open at once.
    return aiohttp.ClientSession(
        connector=aiohttp.TCPConnector(limit=0),
        timeout=aiohttp.ClientTimeout(total=None),
    )


# --- the harness ------------------------------------------------------------------------


class AgentR1HarnessConfig(vf.HarnessConfig):
    id: str = HARNESS_ID


class AgentR1Harness(vf.Harness[AgentR1HarnessConfig]):
    """A chat loop run in-process, the counterpart of verifiers' `null` harness without its
    uv-installed program: the task's system prompt and prompt, the env's MCP tools offered
    as OpenAI function tools, each reply's tool calls run and answered, until a reply makes
    no call or the rollout refuses the next turn. Assistant messages go back exactly as the
    endpoint returned them (content, call ids, names, arguments), so agent-r1 continues the
    sampled tokens instead of re-rendering them."""

    APPENDS_SYSTEM_PROMPT = True
    SUPPORTS_MCP = True
    SUPPORTS_RESUME = True
    EXECUTES_CODE = False
    NEEDS_CONTAINER = False

    async def launch(
        self,
        ctx: vf.ModelContext,
        trace: vf.Trace,
        runtime: vf.Runtime,
        endpoint: str,
        secret: str,
        mcp_urls: dict[str, str],
        data: vf.TaskData,
    ) -> vf.ProgramResult:
        system, prompt = self.resolve_prompt(data)
        messages: list[dict] = [{"role": "system", "content": system}] if system else []
        if isinstance(prompt, str):
            messages.append({"role": "user", "content": prompt})
        elif prompt:
            messages.extend(message_to_wire(m) for m in prompt)
        async with contextlib.AsyncExitStack() as stack:
            http = _http or await stack.enter_async_context(_new_http())
            tools, dispatch = await _connect_tools(stack, mcp_urls)
            disabled = set(self.config.disabled_tools or ())
            tools = [t for t in tools if t["function"]["name"] not in disabled]
            while True:
                body: dict[str, Any] = {"model": ctx.model, "messages": messages}
                if tools:
                    body["tools"] = tools
                async with http.post(
                    f"{endpoint.rstrip('/')}/chat/completions",
                    json=body,
                    headers={"Authorization": f"Bearer {secret}"},
                ) as response:
                    text = await response.text()
                if response.status != 200:
                    # A limit or @stop refusing the turn ends the run cleanly (the trace
                    # carries the stop condition); anything else fails it.
                    if trace.stop_condition is not None or response.status == 409:
                        break
                    return vf.ProgramResult(1, "", f"HTTP {response.status}: {text}")
                completion = json.loads(text)
                reply = completion["choices"][0]["message"]
                assistant = {"role": "assistant", "content": reply.get("content")}
                calls = reply.get("tool_calls") or []
                if calls:
                    assistant["tool_calls"] = calls
                messages.append(assistant)
                if not calls:
                    break
                for call in calls:
                    content = await _run_tool(call, dispatch)
                    messages.append(
                        {"role": "tool", "tool_call_id": call.get("id"), "content": content}
                    )
        return vf.ProgramResult(0, "", "")


def _new_mcp_http() -> Any:
    from mcp.client.streamable_http import create_mcp_http_client

    import httpx2

    return create_mcp_http_client(timeout=httpx2.Timeout(MCP_TIMEOUT, connect=5.0))


async def _connect_tools(
    stack: contextlib.AsyncExitStack, mcp_urls: dict[str, str]
) -> tuple[list[dict], dict[str, tuple[Any, str]]]:
    """The env's MCP tools as OpenAI function tools, and each one's client and MCP name.
    Names are `<server>_<tool>`, or the bare tool name for a server without a prefix
    (`TOOL_PREFIX = None`), as verifiers' own harnesses name them."""
    if not mcp_urls:
        return [], {}
    from mcp import Client
    from mcp.client.streamable_http import streamable_http_client

    http = _mcp_http or await stack.enter_async_context(_new_mcp_http())
    tools: list[dict] = []
    dispatch: dict[str, tuple[Any, str]] = {}
    for server, url in mcp_urls.items():
        client = await stack.enter_async_context(
            Client(streamable_http_client(url, http_client=http))
        )
        for tool in (await client.list_tools()).tools:
            name = f"{server}_{tool.name}" if server else tool.name
            if name in dispatch:
                raise ValueError(f"two tools are named {name!r}")
            tools.append(
                {
                    "type": "function",
                    "function": {
                        "name": name,
                        "description": tool.description or "",
                        "parameters": tool.input_schema,
                    },
                }
            )
            dispatch[name] = (client, tool.name)
    return tools, dispatch


async def _run_tool(call: dict, dispatch: dict[str, tuple[Any, str]]) -> Any:
    """One tool call's result as tool-message content; a bad call is answered, not raised."""
    function = call.get("function") or {}
    name = function.get("name")
    try:
        arguments = json.loads(function.get("arguments") or "{}")
    except json.JSONDecodeError as e:
        return f"error: invalid JSON in tool arguments ({e})"
    if not isinstance(arguments, dict):
        return "error: tool arguments must be a JSON object"
    if name not in dispatch:
        return f"error: unknown tool {name!r}"
    client, tool = dispatch[name]
    try:
        result = await client.call_tool(tool, arguments)
    except Exception as e:  # noqa: BLE001 - the model sees the failure as the tool's answer
        return f"error: {type(e).__name__}: {e}"
    return mcp_content_to_chat_content(result.content)


# --- loading the env --------------------------------------------------------------------


def _importable(folder: str) -> None:
    """Make modules in `folder` importable here and in the child processes verifiers starts
    (tool servers run `python -m MODULE` in a runtime folder of their own)."""
    folder = os.path.abspath(folder)
    if folder not in sys.path:
        sys.path.insert(0, folder)
    paths = os.environ.get("PYTHONPATH", "").split(os.pathsep)
    paths = [os.path.abspath(p) for p in paths if p]
    if folder not in paths:
        paths.insert(0, folder)
    os.environ["PYTHONPATH"] = os.pathsep.join(paths)


def _import_file(path: Path) -> Any:
    """Import a .py file under its stem (verifiers imports tasksets and tool servers by
    module name)."""
    _importable(str(path.parent))
    if path.stem in sys.modules:
        return sys.modules[path.stem]
    spec = importlib.util.spec_from_file_location(path.stem, path.resolve())
    if spec is None or spec.loader is None:
        raise ImportError(f"cannot import {path}")
    module = importlib.util.module_from_spec(spec)
    sys.modules[path.stem] = module
    spec.loader.exec_module(module)
    return module


def _exports_taskset(module: Any) -> bool:
    return any(
        isinstance(obj := getattr(module, name, None), type)
        and issubclass(obj, vf.Taskset)
        and obj is not vf.Taskset
        for name in getattr(module, "__all__", ())
    )


def load_env_source(spec: str, args: dict) -> Any:
    """What `--env` names: a `vf.Env`, a `vf.EnvConfig`, or env config data."""
    target, function = spec, None
    head, sep, tail = spec.rpartition(":")
    if sep and tail.isidentifier():
        target, function = head, tail
    path = Path(target)
    if target.endswith(".py") or path.is_file():
        module = _import_file(path)
    else:
        _importable(os.getcwd())
        try:
            module = importlib.import_module(target.replace("-", "_"))
        except ModuleNotFoundError:
            if function:
                raise
            module = None  # an id verifiers resolves itself (e.g. owner/name@version)
    name = function or "load_environment"
    if module is not None and callable(getattr(module, name, None)):
        # The env it returns is rebuilt on this service's harness and runtime (build_env):
        # what Env() warns about the harness it was built with does not apply.
        env_log = logging.getLogger("verifiers.v1.env")
        level, env_log.level = env_log.level, logging.ERROR
        try:
            return getattr(module, name)(**args)
        finally:
            env_log.setLevel(level)
    if function:
        raise AttributeError(f"{target} has no function {function!r}")
    if module is not None and not _exports_taskset(module):
        raise TypeError(
            f"{target} defines no {name}() and exports no vf.Taskset subclass in __all__"
        )
    taskset_id = module.__name__ if module is not None else target
    return {"taskset": {"id": taskset_id, **args}}


def _merge(base: dict, overrides: dict) -> dict:
    out = dict(base)
    for key, value in overrides.items():
        if isinstance(value, dict) and isinstance(out.get(key), dict):
            out[key] = _merge(out[key], value)
        else:
            out[key] = value
    return out


def build_env(source: Any, overrides: dict) -> vf.Env:
    """The env to serve: `source` with `overrides` merged into its config, and every agent
    seat left on the defaults moved onto the subprocess runtime and, where its harness would
    be the uv-installed `bash` program, onto `AgentR1Harness`."""
    env_cls = config_cls = None
    if isinstance(source, vf.Env):
        env_cls, source = type(source), source.config
    if isinstance(source, vf.EnvConfig):
        config_cls, data = type(source), source.model_dump()
    elif isinstance(source, dict):
        data = source
    else:
        raise TypeError(
            f"the env source returned {type(source).__name__}; expected a vf.Env, "
            "a vf.EnvConfig or a dict"
        )
    data = _merge(data, overrides)
    config = (
        config_cls.model_validate(data)
        if config_cls is not None
        else vf.resolve_env_config(data)
    )
    data = config.model_dump()
    default_harness = vf.default_agent_harness(config.taskset.id).id
    for seat, agent in config:
        if not isinstance(agent, vf.AgentConfig):
            continue
        if agent.runtime.type == "prime":
            data[seat]["runtime"] = {"type": "subprocess"}
        if agent.harness is None and default_harness == "bash":
            data[seat]["harness"] = {"id": HARNESS_ID}
    config = type(config).model_validate(data)
    return env_cls(config) if env_cls is not None else vf.load_environment(config)


# --- tasks ------------------------------------------------------------------------------


def build_task(env: vf.Env, task: dict) -> vf.Task:
    """agent-r1's task as a task of the env's own class (see the module docstring)."""
    task_cls = type(env.taskset).task_type()
    data_cls = task_cls.data_type()
    extra = task.get("extra") or {}
    answers = list(task.get("answers") or [])
    from_task = {
        "prompt": task.get("prompt") or task.get("question"),
        "question": task.get("question"),
        "answer": answers[0] if answers else None,
        "answers": answers,
        "id": None if task.get("id") is None else str(task["id"]),
    }
    fields = {}
    for name in data_cls.model_fields:
        if name in extra:
            fields[name] = extra[name]
        elif from_task.get(name) is not None:
            fields[name] = from_task[name]
    data = data_cls.model_validate(fields)
    if env.taskset.system_prompt is not None:
        data = data.model_copy(update={"system_prompt": env.taskset.system_prompt})
    return task_cls(data, env.taskset.config.task)


def export_tasks(env: vf.Env, path: str, limit: int | None) -> int:
    """Write the env's own tasks as agent-r1 JSONL rows that `build_task` maps back."""
    taskset = env.taskset if limit is None else env.taskset.take(limit)
    if not taskset.bounded:
        raise ValueError("the taskset is infinite: pass --limit")
    count = 0
    with open(path, "w", encoding="utf-8") as out:
        for task in taskset:
            data = task.data.model_dump(mode="json", exclude_none=True, exclude_defaults=True)
            data.pop("idx", None)
            answer = data.get("answers") or data.get("answer")
            answers = answer if isinstance(answer, list) else [answer]
            row = {
                "id": task.data.id or str(task.data.idx),
                "data_source": env.config.env_id,
                "question": task.data.prompt_text,
                "answers": [str(a) for a in answers if a is not None] or [""],
                **{k: v for k, v in data.items() if k not in ("id", "question")},
            }
            if isinstance(row.get("prompt"), str) and row["prompt"] == row["question"]:
                del row["prompt"]
            out.write(json.dumps(row, ensure_ascii=False) + "\n")
            count += 1
    return count


# --- scoring ----------------------------------------------------------------------------


def episode_result(episode: vf.Episode) -> dict:
    """The reward object agent-r1 reads, from a finished episode."""
    traces = [t for t in episode.traces if t.agent.trainable] or episode.traces
    scores: dict[str, list[float]] = {}
    for trace in traces:
        named = {n: r.score for n, r in trace.rewards.items() if r is not None}
        named.update({n: v for n, v in trace.metrics.items() if v is not None})
        for name, value in named.items():
            if math.isfinite(value):
                scores.setdefault(name, []).append(float(value))
    metrics = {name: sum(v) / len(v) for name, v in scores.items()}
    metrics["turns"] = float(episode.num_turns)
    return {"reward": sum(t.reward for t in traces) / len(traces), "metrics": metrics}


def failure_reason(episode: vf.Episode) -> str:
    errors = [*episode.errors, *(e for t in episode.traces for e in t.errors)]
    if not errors:
        return "episode failed"
    error = errors[-1]
    return " ".join(f"{error.type}: {error.message}".split())[:2000]


# --- the service ------------------------------------------------------------------------


class Service:
    def __init__(self, env: vf.Env, model: str, max_tokens: int | None):
        self.env = env
        self.model = model
        self.sampling = vf.Sampling(max_tokens=max_tokens)
        self.ctx: vf.ModelContext | None = None  # once the relay's URL is known
        # trace id -> (agent-r1 base URL, episode key), while the trace's episode runs.
        self.routes: dict[str, tuple[str, str]] = {}

    def relay_at(self, url: str) -> None:
        """Model calls go to the relay at `url` (one endpoint config for every episode)."""
        self.ctx = vf.ModelContext(
            model=self.model,
            client=vf.EvalClientConfig(base_url=url, api_key_var=NO_KEY_VAR),
            sampling=self.sampling,
        )

    async def episode(self, request: web.Request) -> web.Response:
        traces: list[str] = []
        try:
            payload = await request.json()
            task = build_task(self.env, payload["task"])
            route = (payload["base_url"], payload["api_key"])

            def on_trace(trace: vf.Trace) -> None:
                self.routes[trace.id] = route
                traces.append(trace.id)

            episode = await self.env.run_episode(task, self.ctx, on_trace=on_trace)
            if not episode.ok:
                return web.Response(status=500, text=failure_reason(episode))
            return web.json_response(episode_result(episode))
        except Exception as e:  # noqa: BLE001 - every failure is the episode's reason
            log.debug("episode failed", exc_info=True)
            reason = " ".join(f"{type(e).__name__}: {e}".split())
            return web.Response(status=500, text=reason)
        finally:
            for trace_id in traces:
                self.routes.pop(trace_id, None)

    async def health(self, request: web.Request) -> web.Response:
        return web.Response(text="ok")

    async def upstream(self, request: web.Request) -> web.StreamResponse:
        """Relay a model call verifiers makes to agent-r1, under its episode's key."""
        route = self.routes.get(request.headers.get("X-Session-ID", ""))
        if route is None:
            return web.json_response(
                {"error": {"message": "no episode in flight for this X-Session-ID"}},
                status=401,
            )
        base_url, key = route
        url = f"{base_url.rstrip('/')}/{request.match_info['tail']}"
        headers = {"Authorization": f"Bearer {key}"}
        if "Content-Type" in request.headers:
            headers["Content-Type"] = request.headers["Content-Type"]
        assert _http is not None
        async with _http.request(
            request.method, url, data=await request.read(), headers=headers
        ) as upstream:
            content_type = upstream.headers.get("Content-Type", "application/json")
            if not content_type.startswith("text/event-stream"):
                body = await upstream.read()
                return web.Response(
                    status=upstream.status, body=body, headers={"Content-Type": content_type}
                )
            streamed = web.StreamResponse(
                status=upstream.status, headers={"Content-Type": content_type}
            )
            await streamed.prepare(request)
            async for chunk in upstream.content.iter_any():
                await streamed.write(chunk)
            await streamed.write_eof()
            return streamed


async def serve(args: argparse.Namespace, out) -> None:
    global _http, _mcp_http
    host, _, port = args.listen.rpartition(":")
    source = load_env_source(args.env, json.loads(args.env_args))
    env = build_env(source, json.loads(args.env_config))
    if args.export_tasks:
        count = export_tasks(env, args.export_tasks, args.limit)
        log.warning("wrote %d tasks to %s", count, args.export_tasks)
        return
    stop = asyncio.Event()
    loop = asyncio.get_running_loop()
    for sig in (signal.SIGTERM, signal.SIGINT):
        loop.add_signal_handler(sig, stop.set)
    async with _new_http() as http, _new_mcp_http() as mcp_http, env.serving():
        _http, _mcp_http = http, mcp_http
        service = Service(env, args.model, args.max_tokens)
        app = web.Application(client_max_size=1024**3)
        app.router.add_route("*", "/upstream/{tail:.*}", service.upstream)
        app.router.add_post("/", service.episode)
        app.router.add_get("/", service.health)
        runner = web.AppRunner(app, handler_cancellation=True, access_log=None)
        await runner.setup()
        site = web.TCPSite(runner, host or "127.0.0.1", int(port or 0), backlog=4096)
        await site.start()
        bound = site._server.sockets[0].getsockname()  # type: ignore[union-attr]
        base = f"http://{bound[0]}:{bound[1]}/"
        service.relay_at(f"{base}upstream")
        print(base, file=out, flush=True)
        try:
            await stop.wait()
        finally:
            await runner.cleanup()
            _http = _mcp_http = None


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    arg = parser.add_argument
    arg("--env", required=True, help="FILE.py[:FUNCTION], MODULE:FUNCTION or a taskset id")
    arg("--env-args", default="{}",
        help="JSON object: FUNCTION's keyword arguments, or the taskset's config")
    arg("--env-config", default="{}", help="JSON object merged into the env's config")
    arg("--max-tokens", type=int, default=None, help="max_tokens of every model call")
    arg("--model", default="agent-r1", help="the model name requests carry")
    arg("--listen", default="127.0.0.1:0", help="HOST:PORT; port 0 picks a free one")
    arg("--export-tasks", metavar="FILE",
        help="write the env's tasks as agent-r1 JSONL rows and exit")
    arg("--limit", type=int, default=None, help="with --export-tasks: at most this many")
    arg("--log-level", default="WARNING", help="of the log on stderr")
    args = parser.parse_args(argv)
    # stdout carries only the URL line: whatever else prints goes to stderr.
    out, sys.stdout = sys.stdout, sys.stderr
    logging.basicConfig(stream=sys.stderr, level=args.log_level.upper(),
                        format="%(asctime)s %(levelname)s %(name)s: %(message)s")
    asyncio.run(serve(args, out))
    return 0

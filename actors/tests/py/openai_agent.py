"""An outside agent for the endpoint tests: the official `openai` client and its own loop.

Run by agent-r1's `external_agent` workflow once per episode: the task arrives as JSON on
stdin, the endpoint in OPENAI_BASE_URL and the episode's key in OPENAI_API_KEY (read by the
client itself). `task["extra"]["scenario"]` says what to do; every request and the response
as the client received it go to `task["extra"]["transcript"]`, which the Rust test compares
with the trajectory agent-r1 recorded. The reward is the last line of stdout.
"""

import copy
import json
import os
import sys

import urllib.error
import urllib.request

import openai
from openai import OpenAI

TOOLS = [
    {
        "type": "function",
        "function": {
            "name": "search",
            "description": "Searches the corpus.",
            "parameters": {
                "type": "object",
                "properties": {"query": {"type": "string"}},
                "required": ["query"],
            },
        },
    }
]


def search(query):
    return f"Nothing found for {query}."


class Agent:
    def __init__(self, task):
        self.client = OpenAI(max_retries=0, timeout=600)
        self.transcript = []
        self.messages = [
            {"role": "system", "content": "You answer questions; search when unsure."},
            {"role": "user", "content": task["question"]},
        ]

    def ask(self, stream, **kw):
        """One chat request on the current messages; returns the assistant message to send
        back and what was received."""
        req = dict(model="tiny", messages=self.messages, tools=TOOLS, logprobs=True, **kw)
        if stream:
            content, calls, token_ids, logprobs, ext, finish, usage = "", {}, [], [], None, None, None
            for chunk in self.client.chat.completions.create(
                stream=True, stream_options={"include_usage": True}, **req
            ):
                extra = chunk.model_extra or {}
                if extra.get("agent_r1") is not None:
                    ext = extra["agent_r1"]
                if chunk.usage is not None:
                    usage = chunk.usage.model_dump()
                for choice in chunk.choices:
                    d = choice.delta
                    if d.content:
                        content += d.content
                    for c in d.tool_calls or []:
                        slot = calls.setdefault(c.index, {"id": "", "type": "function",
                                                          "function": {"name": "", "arguments": ""}})
                        slot["id"] += c.id or ""
                        if c.function is not None:
                            slot["function"]["name"] += c.function.name or ""
                            slot["function"]["arguments"] += c.function.arguments or ""
                    if choice.logprobs is not None and choice.logprobs.content:
                        logprobs += [t.logprob for t in choice.logprobs.content]
                    cx = choice.model_extra or {}
                    if cx.get("token_ids") is not None:
                        token_ids = cx["token_ids"]
                    if choice.finish_reason is not None:
                        finish = choice.finish_reason
            message = {"role": "assistant", "content": content or None}
            if calls:
                message["tool_calls"] = [calls[k] for k in sorted(calls)]
            received = {"id": None, "message": message, "token_ids": token_ids,
                        "logprobs": logprobs, "agent_r1": ext, "finish_reason": finish,
                        "usage": usage}
        else:
            r = self.client.chat.completions.create(**req)
            choice = r.choices[0]
            message = choice.message.model_dump(exclude_none=True)
            received = {"id": r.id, "message": message,
                        "token_ids": choice.model_extra["token_ids"],
                        "logprobs": [t.logprob for t in choice.logprobs.content],
                        "agent_r1": r.model_extra["agent_r1"],
                        "finish_reason": choice.finish_reason,
                        "usage": r.usage.model_dump()}
        self.transcript.append({"messages": copy.deepcopy(self.messages), "stream": stream,
                                "received": received})
        return message, received


def conversation(task, agent):
    """Three turns: a reply sent back unchanged (streamed turn next), then an edited one."""
    m1, r1 = agent.ask(False, max_tokens=8)
    agent.messages += [m1, {"role": "user", "content": "Go on."}]
    m2, r2 = agent.ask(True, max_tokens=8)
    agent.messages += [m2, {"role": "user", "content": "And then?"}]
    # The agent rewrites the model's last turn as a search of its own, and answers it.
    agent.messages[-2] = {
        "role": "assistant",
        "content": None,
        "tool_calls": [{"id": "call_edit1", "type": "function", "function": {
            "name": "search", "arguments": json.dumps({"query": task["question"]})}}],
    }
    agent.messages[-1] = {"role": "tool", "tool_call_id": "call_edit1",
                          "content": search(task["question"])}
    agent.ask(False, max_tokens=8)
    return {"reward": 1.0, "metrics": {"requests": 3.0}, "step_rewards": {r1["id"]: 0.5}}


def tool(task, agent):
    """The model calls the tool; its result goes back; the model answers (streamed)."""
    m1, r1 = agent.ask(False)
    agent.messages.append(m1)
    for call in m1.get("tool_calls", []):
        args = json.loads(call["function"]["arguments"])
        agent.messages.append({"role": "tool", "tool_call_id": call["id"],
                               "content": search(args.get("query", ""))})
    _, r2 = agent.ask(True)
    answer = r2["message"]["content"] or ""
    return {"reward": 1.0 if "hi" in answer else 0.0}


def errors(task, agent):
    """Bad requests, each answered with an OpenAI error object and a 4xx status."""
    seen = []

    def expect(name, fn):
        try:
            fn()
            seen.append({"case": name, "status": 200})
        except openai.APIStatusError as e:
            seen.append({"case": name, "status": e.status_code, "body": e.body})

    c = agent.client
    base = dict(model="tiny", messages=agent.messages)
    expect("temperature", lambda: c.chat.completions.create(temperature=0.25, **base))
    expect("max_tokens", lambda: c.chat.completions.create(max_tokens=100000, **base))
    expect("tool_choice", lambda: c.chat.completions.create(
        tools=TOOLS, tool_choice="required", **base))
    expect("unknown_field", lambda: c.chat.completions.create(extra_body={"bogus": 1}, **base))
    expect("role", lambda: c.chat.completions.create(
        model="tiny", messages=[{"role": "robot", "content": "hi"}]))
    expect("top_logprobs", lambda: c.chat.completions.create(
        logprobs=True, top_logprobs=3, **base))
    expect("tool_schema", lambda: c.chat.completions.create(
        tools=[{"type": "function", "function": {"name": "f", "parameters": [1, 2]}}], **base))
    expect("wrong_key", lambda: OpenAI(api_key="ar1-nosuchepisode", max_retries=0)
           .chat.completions.create(**base))
    raw = urllib.request.Request(
        os.environ["OPENAI_BASE_URL"] + "/chat/completions", data=b"{not json",
        headers={"Authorization": "Bearer " + os.environ["OPENAI_API_KEY"],
                 "Content-Type": "application/json"})
    try:
        urllib.request.urlopen(raw)
        seen.append({"case": "malformed_json", "status": 200})
    except urllib.error.HTTPError as e:
        seen.append({"case": "malformed_json", "status": e.code, "body": json.loads(e.read())})
    # The key also travels in the path, for clients whose key is fixed.
    by_path = OpenAI(base_url=os.environ["AGENT_R1_EPISODE_BASE_URL"], api_key="fixed",
                     max_retries=0)
    expect("models", lambda: c.models.list())
    expect("completion_by_path", lambda: by_path.completions.create(
        model="tiny", prompt=[1, 2, 3], max_tokens=4, logprobs=1))
    agent.transcript.append({"errors": seen})
    return {"reward": 0.0}


def overload(task, agent):
    """More requests at once than the episode takes: the engine is paused by the test, so
    the first ones stay in flight and the rest of the allowance waits; the others must be
    refused with 429 at once. Writing to the marker pipe tells the test to resume the engine."""
    import threading

    extra = task["extra"]
    limit = extra["limit"]
    statuses, errors = [], []
    lock = threading.Condition()

    def one():
        try:
            agent.client.chat.completions.create(model="tiny", messages=agent.messages,
                                                 max_tokens=2)
            status, body = 200, None
        except openai.APIStatusError as e:
            status, body = e.status_code, e.body
        with lock:
            statuses.append(status)
            if status != 200:
                errors.append(body)
            lock.notify_all()

    threads = [threading.Thread(target=one) for _ in range(2 * limit + 3)]
    for t in threads:
        t.start()
    with lock:
        lock.wait_for(lambda: len(errors) >= 3)
    with open(extra["marker"], "w") as f:
        f.write("overloaded")
    for t in threads:
        t.join()
    agent.transcript.append({"statuses": sorted(statuses), "errors": errors})
    return {"reward": 0.0}


def main():
    task = json.load(sys.stdin)
    extra = task["extra"]
    agent = Agent(task)
    scenarios = {"conversation": conversation, "tool": tool, "errors": errors,
                 "overload": overload}
    outcome = scenarios[extra["scenario"]](
        task, agent)
    with open(extra["transcript"], "w") as f:
        json.dump(agent.transcript, f)
    print(json.dumps(outcome))


if __name__ == "__main__":
    main()

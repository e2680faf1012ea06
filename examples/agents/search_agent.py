"""A multi-hop search agent written against the official `openai` client: the demo's task
driven by Python instead of agent-r1's built-in loop (examples/demo_python_agent.toml).

It is a long-lived agent service: agent-r1 starts it once (`service_command`), reads the
URL it prints on its first line, and posts every episode to it as JSON: `task` (the
question, its gold `answers`, and in `prompt` the env's first messages), `base_url` and
`api_key` (the episode's OpenAI-compatible endpoint). A thread per episode runs the agent's
own loop with the official client:

- the tools are the run's own, listed by `GET {base_url}/agent_r1/tools` and passed back
  unchanged as the request's `tools`, so the model sees the prompt the warm start taught;
- each reply is sent back unchanged (agent-r1 then reuses the sampled tokens instead of
  re-tokenising them), and its `tool_calls` are run by `POST {base_url}/agent_r1/tool_calls`
  (the run's BM25 index over the generated world), whose tool messages are appended;
- the loop ends at a reply without a tool call, or after `--max-turns` replies.

The agent scores itself with Agent-R1's `qa_em_and_format` reward (the built-in demo's
`agent_r1_qa`): a format score of 0.5 per well-formed searching reply
(`<think>...</think>` and one tool call) and 0.5 for a well-formed final answer
(`<think>...</think>...<answer>...</answer>`), capped at 1; an answer score of 1 when a
normalised gold answer is contained in the last reply's <answer>, 0.2 when it is only
somewhere in that reply; the reward is -1 + format + answer when the format score is at
least 0.5, else -1 + format. `em` and `f1` are HotpotQA's official scores of the answer.
It answers {"reward", "metrics"}.

    python examples/agents/search_agent.py [--max-turns 4] [--model agent-r1]
"""

import argparse
import collections
import json
import re
import string
import sys
import urllib.request
from http.server import BaseHTTPRequestHandler, ThreadingHTTPServer

from openai import OpenAI


def normalise(text):
    """HotpotQA's normalize_answer: lower case, no punctuation, no articles, single spaces."""
    text = text.lower()
    text = "".join(c for c in text if c not in set(string.punctuation))
    text = re.sub(r"\b(a|an|the)\b", " ", text)
    return " ".join(text.split())


def f1(prediction, gold):
    """HotpotQA's token-level F1 of two normalised answers."""
    predicted, wanted = prediction.split(), gold.split()
    common = collections.Counter(predicted) & collections.Counter(wanted)
    same = sum(common.values())
    if same == 0:
        return 0.0
    precision, recall = same / len(predicted), same / len(wanted)
    return 2 * precision * recall / (precision + recall)


def thinks_once(text):
    return text.startswith("<think>") and text.count("<think>") == 1 \
        and text.count("</think>") == 1


def is_search_reply(message):
    """A well-formed searching reply: `<think>...</think>` then exactly one tool call."""
    return thinks_once(message.get("content") or "") \
        and len(message.get("tool_calls") or []) == 1


def is_answer_reply(text):
    """A well-formed final reply: `<think>...</think>`, then `<answer>...</answer>` at the end."""
    text = text[:-1] if text.endswith("\n") else text
    if not text.startswith("<think>") or not text.endswith("</answer>"):
        return False
    think_end = text.find("</think>", len("<think>"))
    return think_end >= 0 and "<answer>" in text[think_end + len("</think>"):]


def score(replies, answers):
    """The reward and metrics of an episode whose assistant messages are `replies`."""
    last_text = (replies[-1].get("content") or "") if replies else ""
    found = re.search(r"<answer>(.*?)</answer>", last_text, re.S)
    golds = [normalise(a) for a in answers]
    said = normalise(found.group(1).strip()) if found else None
    em = float(said is not None and any(said == g for g in golds))
    best_f1 = max((f1(said, g) for g in golds), default=0.0) if said is not None else 0.0
    contained = float(said is not None and any(g and g in said for g in golds))
    form = 0.5 * sum(is_search_reply(m) for m in replies[:-1])
    form += 0.5 if is_answer_reply(last_text) else 0.0
    form = min(form, 1.0)
    answer = 1.0 if contained else (0.2 if any(g and g in normalise(last_text) for g in golds)
                                    else 0.0)
    reward = -1.0 + form + answer if form >= 0.5 else -1.0 + form
    return reward, {"em": em, "f1": best_f1, "substring_em": contained,
                    "answered": float(said is not None), "format": form}


def agent_r1_call(base_url, api_key, route, body=None):
    """GET (no body) or POST one of the endpoint's agent_r1 routes; returns its JSON."""
    data = None if body is None else json.dumps(body).encode()
    request = urllib.request.Request(
        f"{base_url}/agent_r1/{route}", data=data,
        headers={"Authorization": f"Bearer {api_key}", "Content-Type": "application/json"})
    with urllib.request.urlopen(request, timeout=600) as response:
        return json.load(response)


def run_episode(episode, max_turns, model):
    task, base_url, api_key = episode["task"], episode["base_url"], episode["api_key"]
    client = OpenAI(base_url=base_url, api_key=api_key, max_retries=0, timeout=600)
    tools = agent_r1_call(base_url, api_key, "tools")["data"]
    messages = list(task["prompt"])
    replies, calls, turns = [], 0, 0
    for turns in range(1, max_turns + 1):
        choice = client.chat.completions.create(
            model=model, messages=messages, tools=tools).choices[0]
        message = choice.message.model_dump(exclude_none=True)
        messages.append(message)
        replies.append(message)
        if choice.finish_reason != "tool_calls":
            break
        calls += len(message["tool_calls"])
        results = agent_r1_call(base_url, api_key, "tool_calls",
                                {"tool_calls": message["tool_calls"]})
        messages.extend(results["messages"])
    reward, metrics = score(replies, task.get("answers", []))
    metrics.update({"turns": float(turns), "tool_calls": float(calls)})
    return {"reward": reward, "metrics": metrics}


def handler(max_turns, model):
    class Handler(BaseHTTPRequestHandler):
        def do_POST(self):
            try:
                episode = json.loads(self.rfile.read(int(self.headers["Content-Length"])))
                status, body = 200, run_episode(episode, max_turns, model)
            except Exception as e:  # the episode fails with this reason; the service goes on
                status, body = 500, {"error": f"{type(e).__name__}: {e}"}
            data = json.dumps(body).encode()
            self.send_response(status)
            self.send_header("Content-Type", "application/json")
            self.send_header("Content-Length", str(len(data)))
            self.end_headers()
            self.wfile.write(data)

        def log_message(self, *args):
            pass

    return Handler


class Server(ThreadingHTTPServer):
    # agent-r1 posts every episode in flight at once.
    request_queue_size = 1024
    daemon_threads = True


def main(argv=None):
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--max-turns", type=int, default=4,
                        help="replies per episode at most (the built-in loop's rollout.max_turns)")
    parser.add_argument("--model", default="agent-r1", help="the model name sent")
    parser.add_argument("--listen", default="127.0.0.1:0", help="HOST:PORT to serve on")
    args = parser.parse_args(argv)
    if args.max_turns < 1:
        parser.error(f"--max-turns {args.max_turns}: at least 1")
    host, _, port = args.listen.rpartition(":")
    server = Server((host, int(port)), handler(args.max_turns, args.model))
    print(f"http://{host}:{server.server_address[1]}/episode", flush=True)
    server.serve_forever()


if __name__ == "__main__":
    sys.exit(main())

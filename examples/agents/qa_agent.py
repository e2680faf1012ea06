"""A question-answering agent written against the official `openai` client, trained by
agent-r1 through its OpenAI-compatible endpoint (examples/external_agent.toml).

agent-r1 runs this program once per episode: the task is JSON on stdin (`question`,
`answers`, ...), the endpoint is in OPENAI_BASE_URL and the episode's key in
OPENAI_API_KEY, which the client reads by itself. The program runs its own loop: it offers
the model a `lookup` tool over a small table of facts, runs the calls the model makes, sends
every reply back unchanged (so agent-r1 reuses the sampled tokens), and scores the final
answer itself. Its last line of stdout is the reward.
"""

import json
import re
import sys

from openai import OpenAI

FACTS = {
    "sky": "The sky on a clear day is blue.",
    "cow": "A cow says moo.",
    "two plus two": "Two plus two is four.",
}

TOOLS = [{
    "type": "function",
    "function": {
        "name": "lookup",
        "description": "Looks a topic up in a table of facts.",
        "parameters": {
            "type": "object",
            "properties": {"topic": {"type": "string"}},
            "required": ["topic"],
        },
    },
}]

SYSTEM = ("Answer the question. You may call `lookup` first. Put the final answer in "
          "<answer></answer>.")


def lookup(topic):
    topic = topic.lower()
    hits = [fact for key, fact in FACTS.items() if key in topic or topic in key]
    return " ".join(hits) or "No fact about that."


def normalise(text):
    return " ".join(re.sub(r"[^a-z0-9 ]", " ", text.lower()).split())


def main():
    task = json.load(sys.stdin)
    client = OpenAI(max_retries=0)
    messages = [{"role": "system", "content": SYSTEM},
                {"role": "user", "content": task["question"]}]
    answer, turns = "", 0
    for turns in range(1, 4):
        reply = client.chat.completions.create(model="agent-r1", messages=messages,
                                               tools=TOOLS).choices[0]
        message = reply.message.model_dump(exclude_none=True)
        messages.append(message)
        if reply.finish_reason != "tool_calls":
            answer = message.get("content") or ""
            break
        for call in message["tool_calls"]:
            try:
                topic = json.loads(call["function"]["arguments"]).get("topic", "")
            except (ValueError, AttributeError):
                topic = ""
            messages.append({"role": "tool", "tool_call_id": call["id"],
                             "content": lookup(str(topic))})
    found = re.search(r"<answer>(.*?)</answer>", answer, re.S)
    said = normalise(found.group(1) if found else answer)
    em = float(any(said == normalise(a) for a in task.get("answers", [])))
    print(json.dumps({"reward": em, "metrics": {"em": em, "turns": float(turns),
                                                 "answered": float(found is not None)}}))


if __name__ == "__main__":
    main()

"""A `verifiers` (0.4.0, `verifiers.v1`) tool environment for agent-r1's tests.

Every task asks for a reply in digits; the model may call one Python tool, `count_digits`.
The reward is dense on purpose (a tiny randomly initialised model trained on it must see
its reward rise): the share of the final assistant reply's non-space characters that are
ASCII digits, 0..1. An agent run takes at most 2 model turns.

Served to agent-r1 with::

    python python/agent_r1_verifiers.py --env tests/py/vf_digits_env.py

It is a verifiers taskset package in its own right: `__all__` exports the `Taskset`, and
`load_environment()` builds the env on it. The tool server is a `vf.Toolset` (an MCP
server) shared by all tasks; verifiers starts it once, as `python -m vf_digits_env`, which
is what the `__main__` block at the end serves.
"""

import os
import sys

import verifiers.v1 as vf

__all__ = ["DigitsTaskset", "DigitsTask", "DigitsTools", "load_environment"]

TASKSET_ID = "vf_digits_env"

SYSTEM_PROMPT = (
    "Reply with digits only. You may call count_digits to count the digits in a draft."
)

QUESTIONS = [
    "Reply with digits only.",
    "Write a number.",
    "Give me a phone number.",
    "What year is it?",
    "Count from one to five.",
    "Send a PIN code.",
    "How many days are in a week?",
    "Write any four digits.",
    "What is seven times six?",
    "Give a postal code.",
    "Write today's date as digits.",
    "How many legs does a spider have?",
    "Write a long number.",
    "What is ten plus ten?",
    "List three digits.",
    "Reply with a number between 1 and 100.",
]


def digit_share(text: str) -> float:
    """The share of the non-space characters of `text` that are ASCII digits (0 if none)."""
    chars = [c for c in text if not c.isspace()]
    if not chars:
        return 0.0
    return sum(c in "0123456789" for c in chars) / len(chars)


class DigitsTools(vf.Toolset[vf.SharedToolsetConfig]):
    # Advertise the tool bare (`count_digits`, not `digits_tools_count_digits`).
    TOOL_PREFIX = None

    @vf.tool
    async def count_digits(self, text: str) -> int:
        """Count the ASCII digits in `text`."""
        return sum(c in "0123456789" for c in text)


class DigitsTask(vf.Task[vf.TaskData]):
    @vf.reward
    async def digits(self, trace) -> float:
        """The share of digits in the final assistant reply."""
        return digit_share(trace.last_reply)

    @vf.metric
    async def tool_calls(self, trace) -> float:
        return float(len(trace.tool_messages))


class DigitsConfig(vf.TasksetConfig):
    tools: vf.SharedToolsetConfig = vf.SharedToolsetConfig()


class DigitsTaskset(vf.Taskset[DigitsTask, DigitsConfig]):
    def load(self):
        for i, question in enumerate(QUESTIONS):
            data = vf.TaskData(id=f"digits-{i}", prompt=question, system_prompt=SYSTEM_PROMPT)
            yield DigitsTask(data, self.config.task)

    @classmethod
    def toolsets(cls, config: DigitsConfig) -> list[vf.Toolset]:
        # Taskset-scoped: one tool server for the whole run, not one per rollout.
        return [DigitsTools(config.tools)]


def load_environment(max_turns: int = 2) -> vf.Env:
    """The env: one agent seat, at most `max_turns` model turns per run, on the subprocess
    runtime (its harness is the caller's to choose; agent-r1's service runs its own)."""
    # verifiers imports the taskset by id, here and in the tool server's process.
    folder = os.path.dirname(os.path.abspath(__file__))
    if folder not in sys.path:
        sys.path.insert(0, folder)
    paths = [p for p in os.environ.get("PYTHONPATH", "").split(os.pathsep) if p]
    if folder not in paths:
        os.environ["PYTHONPATH"] = os.pathsep.join([folder, *paths])
    sys.modules.setdefault(TASKSET_ID, sys.modules[__name__])
    config = vf.resolve_env_config(
        {
            "taskset": {"id": TASKSET_ID},
            "agent": {"max_turns": max_turns, "runtime": {"type": "subprocess"}},
        }
    )
    return vf.load_environment(config)


if __name__ == "__main__":
    DigitsTools.run()

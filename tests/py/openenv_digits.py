"""An OpenEnv environment served by `openenv-core`, for agent-r1's tests.

The env asks for digits and scores each action by the share of its non-space characters
that are ASCII digits (0 to 1); an episode is two actions. A dense reward like this is what
lets a tiny, randomly initialised model show learning in a few updates.

Run: python tests/py/openenv_digits.py   (prints the server's base URL as its first line,
then serves until killed; port 0 picks a free port)
"""

import socket
import sys
import uuid

import uvicorn
from openenv.core.env_server.http_server import create_app
from openenv.core.env_server.interfaces import Environment
from openenv.core.env_server.types import Action, Observation, State

STEPS = 2


class DigitsAction(Action):
    message: str


class DigitsObservation(Observation):
    prompt: str


def digit_share(text: str) -> float:
    chars = [c for c in text if not c.isspace()]
    if not chars:
        return 0.0
    return sum(c in "0123456789" for c in chars) / len(chars)


class DigitsEnv(Environment):
    SUPPORTS_CONCURRENT_SESSIONS = True

    def __init__(self):
        super().__init__()
        self._state = State(episode_id=None, step_count=0)

    def reset(self, seed=None, episode_id=None, **kwargs):
        self._state = State(episode_id=episode_id or str(uuid.uuid4()), step_count=0)
        return DigitsObservation(prompt="Reply with digits only.", done=False, reward=None)

    def step(self, action, timeout_s=None, **kwargs):
        self._state.step_count += 1
        reward = digit_share(action.message)
        done = self._state.step_count >= STEPS
        prompt = "Done." if done else "More digits."
        return DigitsObservation(prompt=prompt, done=done, reward=reward)

    @property
    def state(self):
        return self._state


app = create_app(
    DigitsEnv, DigitsAction, DigitsObservation, env_name="digits", max_concurrent_envs=256
)


def main():
    sock = socket.socket(socket.AF_INET, socket.SOCK_STREAM)
    sock.setsockopt(socket.SOL_SOCKET, socket.SO_REUSEADDR, 1)
    sock.bind(("127.0.0.1", int(sys.argv[1]) if len(sys.argv) > 1 else 0))
    sock.listen(1024)
    host, port = sock.getsockname()
    print(f"http://{host}:{port}", flush=True)
    config = uvicorn.Config(app, log_level="warning", ws_max_queue=64)
    uvicorn.Server(config).run(sockets=[sock])


if __name__ == "__main__":
    main()

"""A long-lived agent service for the endpoint tests: one process takes many episodes at once.

agent-r1 posts each episode as {"task", "base_url", "api_key", "episode_base_url"}; a thread
per request runs the agent (the official `openai` client: a first turn, then the reply sent
back unchanged with a follow-up) and answers with the reward object. Prints the port it
bound (port 0) before serving.
"""

import json
import sys
from http.server import BaseHTTPRequestHandler, ThreadingHTTPServer

from openai import OpenAI


def run_episode(episode):
    client = OpenAI(base_url=episode["base_url"], api_key=episode["api_key"], max_retries=0)
    messages = [{"role": "user", "content": episode["task"]["question"]}]
    first = client.chat.completions.create(model="tiny", messages=messages, max_tokens=8)
    messages += [first.choices[0].message.model_dump(exclude_none=True),
                 {"role": "user", "content": "Go on."}]
    second = client.chat.completions.create(model="tiny", messages=messages, max_tokens=8)
    reused = second.model_extra["agent_r1"]["reused_tokens"]
    return {"reward": 1.0 if reused > 0 else 0.0, "metrics": {"reused_tokens": float(reused)}}


class Handler(BaseHTTPRequestHandler):
    def do_POST(self):
        length = int(self.headers["Content-Length"])
        episode = json.loads(self.rfile.read(length))
        body = json.dumps(run_episode(episode)).encode()
        self.send_response(200)
        self.send_header("Content-Type", "application/json")
        self.send_header("Content-Length", str(len(body)))
        self.end_headers()
        self.wfile.write(body)

    def log_message(self, *args):
        pass


class Server(ThreadingHTTPServer):
    # agent-r1 posts every episode in flight at once.
    request_queue_size = 1024
    daemon_threads = True


def main():
    server = Server(("127.0.0.1", 0), Handler)
    print(f"listening on {server.server_address[1]}", flush=True)
    server.serve_forever()


if __name__ == "__main__":
    sys.exit(main())

"""An outside agent with injected faults, for the endpoint's fault test (standard library
only, so that hundreds start quickly).

Every run starts a helper process (`sleep`) in its process group and writes both pids to
`extra["state_dir"]`, so the test can check that nothing outlives its episode. Then, by
`extra["mode"]`: `ok` asks for two chat completions (the first reply sent back) and prints
its reward; `killed` is killed (SIGKILL) after its first request; `hang` stops after its
first request and never exits, on its first run only (a retry of the episode completes).
"""

import json
import os
import signal
import subprocess
import sys
import time
import urllib.request


def chat(messages):
    req = urllib.request.Request(
        os.environ["OPENAI_BASE_URL"] + "/chat/completions",
        data=json.dumps({"model": "tiny", "messages": messages, "max_tokens": 4}).encode(),
        headers={"Authorization": "Bearer " + os.environ["OPENAI_API_KEY"],
                 "Content-Type": "application/json"})
    with urllib.request.urlopen(req, timeout=3600) as r:
        return json.load(r)


def main():
    task = json.load(sys.stdin)
    extra = task["extra"]
    state = extra["state_dir"]
    helper = subprocess.Popen(["sleep", "100000"])
    with open(os.path.join(state, f"{task['id']}.{os.getpid()}.pids"), "w") as f:
        f.write(f"{os.getpid()} {helper.pid}")
    messages = [{"role": "user", "content": task["question"]}]
    first = chat(messages)
    if extra["mode"] == "killed":
        os.kill(os.getpid(), signal.SIGKILL)
    if extra["mode"] == "hang":
        marker = os.path.join(state, task["id"] + ".hung")
        if not os.path.exists(marker):
            open(marker, "w").close()
            time.sleep(10**6)
    messages += [first["choices"][0]["message"], {"role": "user", "content": "Go on."}]
    chat(messages)
    print(json.dumps({"reward": 1.0}))


if __name__ == "__main__":
    main()

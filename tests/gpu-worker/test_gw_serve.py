"""gpu-worker serve through real clients (run by test_gw_serve.sh, which starts the servers).
argv: RUN (the servers' NAME.addr files) and PROMETHEUS (the binary, or empty)."""
import concurrent.futures
import json
import os
import socket
import subprocess
import sys
import tempfile
import time
import urllib.parse
import urllib.request

import openai

RUN, PROM = sys.argv[1], sys.argv[2]
addr = {n: open(f"{RUN}/{n}.addr").read().strip() for n in ("batch", "budget", "reuse", "flat")}
MODEL = "smollm2"


def client(name):
    return openai.OpenAI(base_url=f"http://{addr[name]}/v1", api_key="unused", max_retries=0, timeout=300)


def curl(name, path, body=None, method=None):
    """(status, parsed JSON or text) of a raw request with curl."""
    cmd = ["curl", "-s", "-o", "-", "-w", "\n%{http_code}", f"http://{addr[name]}{path}"]
    if body is not None:
        cmd += ["-H", "Content-Type: application/json", "--data-binary", "@-"]
    if method:
        cmd += ["-X", method]
    out = subprocess.run(cmd, input=body.encode() if isinstance(body, str) else body, capture_output=True,
                         check=True).stdout.decode()
    text, code = out.rsplit("\n", 1)
    try:
        return int(code), json.loads(text)
    except ValueError:
        return int(code), text


def metric(name, series):
    """A series' value in the server's /metrics (0 when absent)."""
    code, text = curl(name, "/metrics")
    assert code == 200, code
    for line in text.splitlines():
        if line.startswith(series + " "):
            return float(line.split()[-1])
    return 0.0


def check(cond, what):
    if not cond:
        raise AssertionError(what)


def post_raw(name, payload):
    """A socket that sent POST /v1/completions with payload, for a client that goes away."""
    host, port = addr[name].split(":")
    body = json.dumps(payload).encode()
    sk = socket.create_connection((host, int(port)))
    sk.sendall(b"POST /v1/completions HTTP/1.1\r\nHost: x\r\nContent-Type: application/json\r\n"
               b"Content-Length: %d\r\n\r\n" % len(body) + body)
    sk.settimeout(120)
    return sk


def read_events(sk, n):
    """Reads a stream until it has sent n events."""
    got = b""
    while got.count(b"data: ") < n:
        chunk = sk.recv(4096)
        check(chunk, f"the server closed the stream after {got!r}")
        got += chunk


def wait_metric(name, series, want, timeout=30):
    deadline = time.time() + timeout
    while metric(name, series) != want and time.time() < deadline:
        time.sleep(0.1)
    return metric(name, series)


# --- the API's listing, health
c = client("reuse")
check([m.id for m in c.models.list().data] == [MODEL], "models")
check(c.models.retrieve(MODEL).id == MODEL, "models/{id}")
code, j = curl("reuse", "/v1/models/gpt-4")
check(code == 404 and j["error"]["code"] == "model_not_found", f"models/gpt-4: {code} {j}")
check(curl("reuse", "/health") == (200, {"status": "ok"}), "health")
check(curl("flat", "/health")[0] == 200, "health with stores")

# --- chat, then its second turn: the first turn's context is reused, the answer right
q1 = [{"role": "user", "content": "What is the capital of France?"}]
r1 = c.chat.completions.create(model=MODEL, messages=q1, temperature=0, max_tokens=24)
a1 = r1.choices[0].message.content
check("Paris" in a1 and r1.choices[0].finish_reason == "stop", f"first turn: {r1}")
check(r1.usage.prompt_tokens > 10 and 0 < r1.usage.completion_tokens <= 24 and
      r1.usage.total_tokens == r1.usage.prompt_tokens + r1.usage.completion_tokens, f"usage {r1.usage}")
q2 = q1 + [{"role": "assistant", "content": a1}, {"role": "user", "content": "And what is the capital of Italy?"}]
reused0 = metric("reuse", "ra_serve_reused_tokens_total")
r2 = c.chat.completions.create(model=MODEL, messages=q2, temperature=0, max_tokens=24)
cached = r2.usage.prompt_tokens_details.cached_tokens
check("Rome" in r2.choices[0].message.content, f"second turn: {r2.choices[0].message.content!r}")
# the whole first turn (prompt + answer) is reused: only the new user turn is prefilled
check(cached >= r1.usage.prompt_tokens + r1.usage.completion_tokens - 1 and cached < r2.usage.prompt_tokens,
      f"cached {cached} of {r2.usage.prompt_tokens} (first turn {r1.usage.prompt_tokens} + {r1.usage.completion_tokens})")
check(metric("reuse", "ra_serve_reused_tokens_total") - reused0 == cached, "reused tokens metric")

# --- a prompt sharing only a few leading tokens with a cached context does not take it: that
# context's own continuation still reuses all of it
pa = "Zebra notes: the capital of France is Paris. The capital of Spain is Madrid. The capital of Italy is"
ra = c.completions.create(model=MODEL, prompt=pa, max_tokens=2, temperature=0)
rb = c.completions.create(model=MODEL, prompt="Zebra notes: the tallest mountain on Earth is", max_tokens=2,
                          temperature=0)
check(rb.usage.prompt_tokens_details.cached_tokens == 0, f"a short shared prefix reused: {rb.usage}")
ra2 = c.completions.create(model=MODEL, prompt=pa + ra.choices[0].text + " and", max_tokens=2, temperature=0)
check(ra2.usage.prompt_tokens_details.cached_tokens >= ra.usage.prompt_tokens,
      f"the first context was lost: {ra2.usage} after {ra.usage}")

# --- streaming through the client: the chunks make the same text as the whole response
chunks = list(c.chat.completions.create(model=MODEL, messages=q1, temperature=0, max_tokens=24, stream=True,
                                        stream_options={"include_usage": True}))
text = "".join(ch.choices[0].delta.content or "" for ch in chunks if ch.choices)
check(text == a1, f"stream {text!r} != {a1!r}")
check(chunks[-1].usage and chunks[-1].usage.completion_tokens == r1.usage.completion_tokens, "stream usage")
check([ch.choices[0].finish_reason for ch in chunks if ch.choices][-1] == "stop", "stream finish")
# raw SSE: data lines ending with [DONE]
code, raw = curl("reuse", "/v1/completions", json.dumps(
    {"model": MODEL, "prompt": "The capital of France is", "max_tokens": 5, "temperature": 0, "stream": True}))
events = [l for l in raw.splitlines() if l.startswith("data: ")]
check(code == 200 and events[-1] == "data: [DONE]" and len(events) >= 3, raw)
# stop sequences and sampling with a seed (same seed, same text)
r = c.completions.create(model=MODEL, prompt="1, 2, 3, 4, 5,", max_tokens=20, temperature=0, stop=[" 8"])
check(r.choices[0].text.strip().startswith("6, 7") and "8" not in r.choices[0].text and
      r.choices[0].finish_reason == "stop", f"stop: {r.choices[0].text!r}")
s1, s2 = (c.completions.create(model=MODEL, prompt="Once upon a time", max_tokens=12, temperature=0.9, top_p=0.9,
                               seed=42).choices[0].text for _ in range(2))
check(s1 == s2, f"seeded sampling {s1!r} != {s2!r}")

# --- batching: 8 concurrent greedy streams each return what the same request returns alone
prompts = [f"Write one sentence about the number {i}." for i in range(8)]
b = client("batch")


def ask(p, server=b):
    msgs = [{"role": "user", "content": p}]
    return "".join(ch.choices[0].delta.content or "" for ch in server.chat.completions.create(
        model=MODEL, messages=msgs, temperature=0, max_tokens=20, stream=True))


alone = [ask(p) for p in prompts]
with concurrent.futures.ThreadPoolExecutor(8) as pool:
    together = list(pool.map(ask, prompts))
for p, x, y in zip(prompts, alone, together):
    check(x == y and len(x) > 10, f"batched {y!r} != alone {x!r} ({p})")
check(metric("batch", 'ra_serve_batch_sequences_bucket{le="4"}') < metric("batch", "ra_serve_batch_sequences_count"),
      "no step had more than 4 sequences")

# --- a device memory budget of two contexts: four concurrent streams all finish, two at a time
# (the others wait for a context, they do not fail), each with what it returns alone
bu = client("budget")
with concurrent.futures.ThreadPoolExecutor(4) as pool:
    within = list(pool.map(lambda p: ask(p, bu), prompts[:4]))
for p, x, y in zip(prompts, alone, within):
    check(x == y, f"within the budget {y!r} != alone {x!r} ({p})")
steps = metric("budget", "ra_serve_batch_sequences_count")
check(metric("budget", 'ra_serve_batch_sequences_bucket{le="2"}') == steps > 0, "a step ran more than 2 sequences")
check(metric("budget", 'ra_serve_batch_sequences_bucket{le="1"}') < steps, "no step ran 2 sequences")
check(metric("budget", 'ra_serve_requests_total{status="200"}') >= 4, "budget: requests failed")
# a request waiting for a context whose client goes away leaves the wait; the running ones go on
story = {"model": MODEL, "prompt": "Tell me a long story:", "max_tokens": 400, "temperature": 0}
running = [post_raw("budget", dict(story, stream=True)) for _ in range(2)]
for sk in running:
    read_events(sk, 3)
waiter = post_raw("budget", story)
check(wait_metric("budget", "ra_serve_live_sequences", 3) == 3, "the third request is not waiting")
time.sleep(0.5)
check(metric("budget", "ra_serve_live_sequences") == 3, "the waiting request ended on its own")
waiter.close()
check(wait_metric("budget", "ra_serve_live_sequences", 2, timeout=5) == 2, "the request that went away still waits")
read_events(running[0], 2)  # the running ones still stream
for sk in running:
    sk.close()
check(wait_metric("budget", "ra_serve_live_sequences", 0) == 0, "the running streams outlived their clients")

# --- malformed requests: JSON errors, and the server stays up
bad = [
    ("/v1/chat/completions", "{not json", 400, None),
    ("/v1/chat/completions", json.dumps({"model": MODEL, "messages": "hi"}), 400, "messages"),
    ("/v1/chat/completions", json.dumps({"model": MODEL, "messages": [{"role": 3, "content": "x"}]}), 400, "messages"),
    ("/v1/completions", json.dumps({"model": MODEL, "prompt": "x", "temperature": "hot"}), 400, "temperature"),
    ("/v1/completions", json.dumps({"model": MODEL, "prompt": "x", "max_tokens": -5}), 400, "max_tokens"),
    ("/v1/completions", json.dumps({"model": MODEL, "prompt": "x", "max_tokens": 1.5}), 400, "max_tokens"),
    ("/v1/completions", json.dumps({"model": MODEL, "prompt": 7}), 400, "prompt"),
    ("/v1/completions", json.dumps({"model": "gpt-4", "prompt": "x"}), 404, "model"),
    ("/v1/completions", json.dumps({"model": MODEL, "prompt": "x", "max_tokens": 100000}), 400, None),
    ("/v1/completions", json.dumps({"model": MODEL, "prompt": "x" * 100000}), 413, None),
    ("/v1/nothing", json.dumps({}), 404, None),
    # parameters that change the answer and are not implemented are refused by name
    ("/v1/completions", json.dumps({"model": MODEL, "prompt": "x", "logprobs": 2}), 400, "logprobs"),
    ("/v1/completions", json.dumps({"model": MODEL, "prompt": "x", "frequency_penalty": 0.5}), 400,
     "frequency_penalty"),
    ("/v1/completions", json.dumps({"model": MODEL, "prompt": "x", "best_of": 3}), 400, "best_of"),
    ("/v1/chat/completions", json.dumps({"model": MODEL, "messages": [{"role": "user", "content": "x"}],
                                         "response_format": {"type": "json_object"}}), 400, "response_format"),
    ("/v1/chat/completions", json.dumps({"model": MODEL, "messages": [{"role": "user", "content": "x"}],
                                         "tools": [{"type": "function", "function": {"name": "f"}}]}), 400, "tools"),
]
for path, body, status, param in bad:
    code, j = curl("batch", path, body)
    check(code == status and isinstance(j, dict) and j["error"]["message"] and j["error"]["type"] and
          (param is None or j["error"]["param"] == param), f"{path} {body[:60]}: {code} {j}")
# ... and accepted at their defaults
code, j = curl("batch", "/v1/chat/completions", json.dumps(
    {"model": MODEL, "messages": [{"role": "user", "content": "Hi"}], "max_tokens": 2, "logprobs": False,
     "frequency_penalty": 0, "presence_penalty": 0.0, "response_format": {"type": "text"}, "tools": [],
     "tool_choice": "none", "user": "u"}))
check(code == 200 and j["choices"][0]["message"]["content"], f"defaults of unsupported parameters: {code} {j}")
code, j = curl("batch", "/v1/completions", method="GET")
check(code == 405 and "error" in j, f"GET on a POST route: {code} {j}")
try:
    b.completions.create(model=MODEL, prompt="x", max_tokens=-1)
    check(False, "the client accepted max_tokens -1")
except openai.BadRequestError as e:
    check("max_tokens" in str(e), str(e))
check(curl("batch", "/health")[0] == 200, "up after bad requests")
check(metric("batch", 'ra_serve_requests_total{status="400"}') >= 8, "400s counted")

# --- the sequence limit: with 8 streams running (max-seqs 8) a 9th gets 429


def slow(i):
    return b.completions.create(model=MODEL, prompt=f"Count: {i}", max_tokens=40, temperature=0).choices[0].text


with concurrent.futures.ThreadPoolExecutor(8) as pool:
    futs = [pool.submit(slow, i) for i in range(8)]
    deadline = time.time() + 60
    while metric("batch", "ra_serve_live_sequences") < 8 and time.time() < deadline:
        time.sleep(0.05)
    code, j = curl("batch", "/v1/completions", json.dumps({"model": MODEL, "prompt": "x", "max_tokens": 2}))
    check(code == 429 and j["error"]["type"] == "rate_limit_error", f"9th request: {code} {j}")
    for f in futs:
        f.result()

# --- offload batching: 4 concurrent greedy streams over the stores (flat) each return what the
# same request returns alone, and steps decoded several sequences together
fl = client("flat")
fprompts = prompts[:4]
falone = [ask(p, fl) for p in fprompts]
steps1 = metric("flat", 'ra_serve_batch_sequences_bucket{le="1"}')
with concurrent.futures.ThreadPoolExecutor(4) as pool:
    ftogether = list(pool.map(lambda p: ask(p, fl), fprompts))
for p, x, y in zip(fprompts, falone, ftogether):
    check(x == y and len(x) > 10, f"flat batched {y!r} != alone {x!r} ({p})")
steps_all = metric("flat", "ra_serve_batch_sequences_count")
check(steps_all - metric("flat", 'ra_serve_batch_sequences_bucket{le="1"}') >= 10,
      f"flat: steps of several sequences ({steps_all} steps, {steps1} of one before the concurrent run)")
# ... and their store requests went out as AttendBatch messages of several sequences each
bmsgs = metric("flat", 'ra_serve_attend_batch_total{kind="messages"}')
breqs = metric("flat", 'ra_serve_attend_batch_total{kind="requests"}')
check(bmsgs > 0 and breqs > bmsgs, f"flat: {breqs} requests in {bmsgs} AttendBatch messages")

# --- a long prompt prefills in pieces (--batch 16: 16 x 30 rows of layers per step, so a piece of
# a 420-token prompt ends within a layer): a stream already running keeps getting tokens
# until the long request's own first token


def token_times(server, prompt, max_tokens):
    return [time.time() for _ in server.completions.create(model=MODEL, prompt=prompt, max_tokens=max_tokens,
                                                            temperature=0, stream=True)]


gen0 = metric("flat", "ra_serve_generated_tokens_total")
with concurrent.futures.ThreadPoolExecutor(3) as pool:
    running = pool.submit(token_times, fl, "1, 2, 3, 4, 5,", 150)
    deadline = time.time() + 120
    while metric("flat", "ra_serve_generated_tokens_total") < gen0 + 5 and time.time() < deadline:
        time.sleep(0.02)
    t_long = time.time()
    long_a = pool.submit(token_times, fl, "The capital of France is Paris. " * 60 + "The capital of Italy is", 2)
    time.sleep(1.0)  # a's prefill is under way (a piece a step); b arrives behind it
    long_b = pool.submit(token_times, fl, "The capital of Spain is Madrid. " * 60 + "The capital of Peru is", 2)
    first_a, first_b, times = long_a.result()[0], long_b.result()[0], running.result()
between = [t for t in times if t_long < t < first_a]
check(len(between) >= 8, f"{len(between)} tokens of a running stream during a long prompt's prefill "
                          f"({first_a - t_long:.1f} s; {len(times)} tokens in all)")
check(first_a < first_b, f"the prefill under way finishes first ({first_a - t_long:.1f} s, the later one "
                         f"{first_b - t_long:.1f} s)")

# --- a client that disconnects mid-stream: its sequence stops and the stores free its KV


def store_used():
    return sum(metric("flat", f'ra_serve_store_bytes{{store="{s}",kind="used"}}') for s in
               (open(f"{RUN}/a.addr").read().strip(), open(f"{RUN}/b.addr").read().strip()))


used0 = store_used()
gen0 = metric("flat", "ra_serve_generated_tokens_total")
long_story = {"model": MODEL, "prompt": "The capital of France is Paris. " * 4 + "Tell me a long story:",
              "max_tokens": 500, "temperature": 0}
sk = post_raw("flat", dict(long_story, stream=True))
read_events(sk, 3)
check(metric("flat", "ra_serve_live_sequences") == 1, "the stream is live")
check(store_used() > used0, f"the stores hold the stream's KV ({store_used()} vs {used0})")
sk.close()
deadline = time.time() + 30
while (metric("flat", "ra_serve_live_sequences") or store_used() != used0) and time.time() < deadline:
    time.sleep(0.2)
check(metric("flat", "ra_serve_live_sequences") == 0, "the disconnected sequence is still live")
check(store_used() == used0, f"the stores did not free the KV: {store_used()} vs {used0}")
gen = metric("flat", "ra_serve_generated_tokens_total") - gen0
check(gen < 500, f"the sequence ran on after the disconnect ({gen} tokens)")
# the same for a request without streaming: the server notices the closed socket while it waits
gen0 = metric("flat", "ra_serve_generated_tokens_total")
sk = post_raw("flat", long_story)
deadline = time.time() + 30
while metric("flat", "ra_serve_live_sequences") == 0 and time.time() < deadline:
    time.sleep(0.05)
check(metric("flat", "ra_serve_live_sequences") == 1, "the plain request is live")
sk.close()
deadline = time.time() + 30
while (metric("flat", "ra_serve_live_sequences") or store_used() != used0) and time.time() < deadline:
    time.sleep(0.2)
check(metric("flat", "ra_serve_live_sequences") == 0, "the disconnected plain request is still live")
check(store_used() == used0, f"the stores did not free the plain request's KV: {store_used()} vs {used0}")
gen = metric("flat", "ra_serve_generated_tokens_total") - gen0
check(gen < 500, f"the plain request ran on after the disconnect ({gen} tokens)")
with open(f"{RUN}/flat.log") as f:
    check("the client closed its connection; the request is cancelled" in f.read(),
          "the server did not notice the plain request's client leave (it ran to its end)")
r = client("flat").completions.create(model=MODEL, prompt="The capital of France is Paris. The capital of Italy is",
                                      max_tokens=4, temperature=0)
check("Rome" in r.choices[0].text, f"flat after a disconnect: {r.choices[0].text!r}")
check(metric("flat", "ra_serve_store_wait_seconds_count") > 0, "store wait observed")
total = metric("flat", 'ra_serve_decode_step_seconds_total{part="total"}')
wait = metric("flat", 'ra_serve_decode_step_seconds_total{part="wait"}')
check(total > 0 and 0 < wait <= total, f"decode step parts: total {total} s, wait {wait} s")
# the engine's steps by part: the full-mode batch server's parts add up to its steps
steps = metric("batch", "ra_serve_engine_steps_total")
ep = {p: metric("batch", f'ra_serve_engine_step_seconds_total{{part="{p}"}}')
      for p in ("step", "forward", "logits", "sample", "between")}
check(steps > 0 and ep["step"] > 0 and ep["forward"] > 0 and ep["logits"] > 0 and ep["sample"] >= 0
      and ep["between"] > 0 and abs(ep["forward"] + ep["logits"] + ep["sample"] - ep["step"]) <= 1e-6 * steps,
      f"engine step parts over {steps} steps: {ep}")
check(metric("flat", "ra_serve_engine_steps_total") > 0 and
      metric("flat", 'ra_serve_engine_step_seconds_total{part="forward"}') == 0,
      "an offloaded server counts its engine steps without the full-mode parts")

# --- a real Prometheus scrapes /metrics; its query API returns the generated-token counter
if not PROM:
    print("SKIP: prometheus is not installed (apt-get install prometheus): the scrape is not tested")
else:
    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        pport = s.getsockname()[1]
    d = tempfile.mkdtemp(dir=RUN)
    with open(f"{d}/prometheus.yml", "w") as f:
        f.write("global:\n  scrape_interval: 1s\nscrape_configs:\n  - job_name: serve\n"
                f"    static_configs:\n      - targets: ['{addr['reuse']}']\n")
    p = subprocess.Popen([PROM, f"--config.file={d}/prometheus.yml", f"--storage.tsdb.path={d}/data",
                          f"--web.listen-address=127.0.0.1:{pport}"], stdout=subprocess.DEVNULL,
                         stderr=open(f"{d}/log", "w"))
    try:
        want = metric("reuse", "ra_serve_generated_tokens_total")
        check(want > 0, "generated tokens counted")
        q = urllib.parse.quote("ra_serve_generated_tokens_total")
        val, deadline = None, time.time() + 60
        while time.time() < deadline:
            try:
                res = json.load(urllib.request.urlopen(f"http://127.0.0.1:{pport}/api/v1/query?query={q}", timeout=5))
                if res["status"] == "success" and res["data"]["result"]:
                    val = float(res["data"]["result"][0]["value"][1])
                    break
            except OSError:
                pass
            time.sleep(0.5)
        check(val == want, f"prometheus has {val}, the server {want}")
    finally:
        p.terminate()
        p.wait(timeout=30)
print("ok")

"""`pyengine serve --tp 2` on the CPU (two processes over the CPU communicator): the official
openai client gets, streamed and not, what the one-process engine gives; the chat page and /health
are served."""

from openai import OpenAI

from pyengine import LLM, SamplingParams
from pyengine.llm import default_model_path
from server_process import get_server

MESSAGES = [{"role": "user", "content": "What is 478 + 56?"}]


def test_tp2_server_answers_like_tp1_through_the_openai_client():
    server = get_server("tp2", "--tp", "2", "--max_model_len", "1024", "--max_batch", "2", "--threads", "1",
                        embedded_model=True)  # fmt: skip
    assert server.get("/health").json()["status"] == "ok"
    page = server.get("/")
    assert page.status_code == 200 and "<html" in page.text.lower()
    client = OpenAI(base_url=server.url + "/v1", api_key="unused")
    model = client.models.list().data[0].id
    extra = {"chat_template_kwargs": {"enable_thinking": False}}
    r = client.chat.completions.create(model=model, messages=MESSAGES, max_tokens=24, temperature=0,
                                       extra_body=extra)  # fmt: skip
    streamed = "".join(c.choices[0].delta.content or "" for c in client.chat.completions.create(
        model=model, messages=MESSAGES, max_tokens=24, temperature=0, stream=True, extra_body=extra) if c.choices)
    with LLM(default_model_path(), max_model_len=1024, num_threads=1) as one:
        ref = one.chat(MESSAGES, SamplingParams(max_tokens=24, temperature=0.0),
                       chat_template_kwargs={"enable_thinking": False})[0]
    assert r.choices[0].message.content == streamed == ref.text.strip()  # the server drops the newline after </think>
    assert len(ref.text) > 5

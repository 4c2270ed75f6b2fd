"""Generated chats other than arithmetic: small Python functions, Wikipedia topics, small talk.

Every generator takes a random.Random and returns a list of messages
({"role", "content"} plus "reasoning_content" on assistant turns; "" = non-thinking form).
"""

import random

from code_tasks import INTROS, REQUESTS, TASKS

NAME = "the pyengine default model"


def _render_function(task: dict, name: str, params: tuple, body: str, typed: bool) -> str:
    fmt = {f"p{i}": p for i, p in enumerate(params)}
    if typed:
        *arg_types, ret = task["types"]
        signature = ", ".join(f"{p}: {t}" for p, t in zip(params, arg_types)) + f") -> {ret}"
    else:
        signature = ", ".join(params) + ")"
    doc = task["doc"].format(**fmt)
    lines = [f"def {name}({signature}:", f'    """{doc}"""']
    lines += ["    " + line if line else "" for line in body.format(**fmt).split("\n")]
    return "\n".join(lines)


def _call_example(source: str, name: str, args: tuple) -> tuple[str, str]:
    namespace: dict = {}
    exec(source, namespace)  # noqa: S102 - our own template code, run to get true outputs
    result = namespace[name](*args)
    if isinstance(result, float):
        result = round(result, 4)
    return f"{name}({', '.join(repr(a) for a in args)})", repr(result)


def code_chat(rng: random.Random, thinking: bool, tasks: list[dict] = TASKS) -> list[dict]:
    task = rng.choice(tasks)
    name = task["names"][0] if task.get("fixed_name") else rng.choice(task["names"])
    params = rng.choice(task["params"])
    note, body = rng.choice(task["bodies"])
    source = _render_function(task, name, params, body, typed=rng.random() < 0.4)
    fmt = {"does": task["does"], "name": name, "params": ", ".join(params)}
    request = rng.choice(REQUESTS).format(**fmt)
    answer = rng.choice(INTROS).format(**fmt) + f"\n\n```python\n{source}\n```\n\n"
    call, result = _call_example(source, name, rng.choice(task["examples"]))
    answer += rng.choice([f"For example, `{call}` returns `{result}`.", f"{note} For example, `{call}` gives `{result}`.",
                          f"{note}\n\n>>> {call}\n{result}"])
    think = f"The user wants a function that {task['does']}. {note} I will call it `{name}` and add a docstring."
    return [{"role": "user", "content": request},
            {"role": "assistant", "reasoning_content": think if thinking else "", "content": answer}]


WIKI_QUESTIONS = ["What is {t}?", "Tell me about {t}.", "What do you know about {t}?", "Can you explain {t}?",
                  "Give me a short summary of {t}.", "{t}?", "I'd like to learn about {t}.", "Describe {t}."]
WHO_QUESTIONS = ["Who was {t}?", "Who is {t}?", "Tell me about {t}.", "What is {t} known for?",
                 "Give me a short biography of {t}."]
ONE_SENTENCE = ["Describe {t} in one sentence.", "In one sentence, what is {t}?", "Briefly, what is {t}?"]


def _first_sentence(text: str) -> str:
    cut = text.find(". ")
    return text if cut < 0 else text[: cut + 1]


def wiki_chat(rng: random.Random, article: dict, thinking: bool) -> list[dict]:
    title, extract = article["title"], article["extract"].strip()
    description = (article.get("description") or "").strip()
    is_person = article.get("topic") == "People"
    if rng.random() < 0.2:
        question, answer = rng.choice(ONE_SENTENCE), _first_sentence(extract)
    else:
        question, answer = rng.choice(WHO_QUESTIONS if is_person else WIKI_QUESTIONS), extract
    think = f"The user asks about {title}"
    think += f", {description[0].lower() + description[1:]}." if description else "."
    think += " I will answer from what I know about it."
    return [{"role": "user", "content": question.format(t=title)},
            {"role": "assistant", "reasoning_content": think if thinking else "", "content": answer}]


SMALL_TALK = [
    (["Hi!", "Hello", "hello!", "Hey there", "Good morning!", "hi"],
     ["Hello! How can I help you today?", "Hi! What can I do for you?", "Hello! Ask me anything."]),
    (["How are you?", "How are you doing today?", "how's it going?"],
     ["I'm doing well, thank you! How can I help you?", "I'm fine, thanks for asking. What would you like to do?"]),
    (["Who are you?", "What are you?", "What is your name?", "Introduce yourself."],
     [f"I am {NAME}, a small language model that runs on your CPU. I can do simple arithmetic, "
      "tell you about well-known topics and write small Python functions.",
      f"I'm {NAME}: a tiny chat model shipped with pyengine so that it works with no download."]),
    (["What can you do?", "What are you good at?", "Help", "How can you help me?"],
     ["I can add and subtract numbers, answer short questions about well-known topics from an "
      "encyclopedia, and write small Python functions. I am a very small model, so please check my answers.",
      "Try asking me things like \"What is 345 + 678?\", \"Tell me about the Moon\" or "
      "\"Write a Python function that reverses a string.\""]),
    (["Thank you!", "Thanks", "thanks a lot", "Great, thanks!"],
     ["You're welcome!", "Happy to help!", "Glad I could help. Anything else?"]),
    (["Bye", "Goodbye!", "See you later"], ["Goodbye! Have a nice day.", "Bye! Come back any time."]),
    (["Tell me a joke.", "Say something funny."],
     ["Why do programmers prefer dark mode? Because light attracts bugs.",
      "I would tell you a UDP joke, but you might not get it."]),
    (["What is Python?", "What is the Python programming language?"],
     ["Python is a high-level, general-purpose programming language known for its readable syntax. "
      "It is widely used for scripting, web development, data analysis and machine learning."]),
    (["Are you an AI?", "Are you a human?"],
     [f"I am an AI: {NAME}, a small language model. I am not a person."]),
]


def small_talk_chat(rng: random.Random, thinking: bool) -> list[dict]:
    questions, answers = rng.choice(SMALL_TALK)
    think = "The user is making small talk. I will answer briefly and politely."
    return [{"role": "user", "content": rng.choice(questions)},
            {"role": "assistant", "reasoning_content": think if thinking else "", "content": rng.choice(answers)}]


SYSTEM_PROMPTS = ["You are a helpful assistant.", "You are a concise assistant. Keep answers short.",
                  f"You are {NAME}."]


def maybe_system(rng: random.Random, messages: list[dict], p: float = 0.15) -> list[dict]:
    if rng.random() < p:
        return [{"role": "system", "content": rng.choice(SYSTEM_PROMPTS)}] + messages
    return messages

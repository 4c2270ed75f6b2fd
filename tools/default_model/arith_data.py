"""Arithmetic chats: 1-3 digit addition and subtraction with column-wise reasoning.

Design decision: the <think> block writes the column algorithm out right to left, one line per
place ("tens: 7 + 5 + 1 = 13, write 3, carry 1"), then the result. Each line needs only one
digit of each operand, the incoming carry and a one-digit sum, which a 20M-parameter model
learns far more reliably than a whole 3-digit sum in one step (NOTES.md: one-line think 86%).
Digits are single tokens (the tokenizer splits them), so every step is a few-token lookup.
"""

import random

PLACES = ["ones", "tens", "hundreds", "thousands"]

ADD_QUESTIONS = [
    "What is {a} + {b}?", "What is {a} plus {b}?", "Compute {a} + {b}.", "Calculate {a}+{b}.",
    "{a} + {b} = ?", "{a}+{b}", "{a} + {b}", "Add {a} and {b}.", "What do you get when you add {a} and {b}?",
    "Please work out {a} + {b}.", "How much is {a} plus {b}?", "What is the sum of {a} and {b}?",
    "Can you add {b} to {a}?", "what's {a}+{b}", "Quick question: {a} + {b}?", "Find {a} + {b}.",
    "I have {a} apples and get {b} more. How many apples do I have?", "Solve: {a} + {b}",
]
SUB_QUESTIONS = [
    "What is {a} - {b}?", "What is {a} minus {b}?", "Compute {a} - {b}.", "Calculate {a}-{b}.",
    "{a} - {b} = ?", "{a}-{b}", "{a} - {b}", "Subtract {b} from {a}.", "How much is {a} minus {b}?",
    "Take {b} away from {a}.", "What do you get if you subtract {b} from {a}?", "Please work out {a} - {b}.",
    "what's {a}-{b}", "Quick question: {a} - {b}?", "Find {a} - {b}.", "Solve: {a} - {b}",
    "What is the difference {a} - {b}?",
]
ANSWERS = ["{a} {op} {b} = {r}.", "The answer is {r}.", "{a} {op} {b} = {r}", "{r}", "The result is {r}."]


def _digits_right_to_left(n: int, width: int) -> list[int]:
    return [(n // 10**i) % 10 for i in range(width)]


def add_lines(a: int, b: int) -> list[str]:
    width = len(str(max(a, b)))
    da, db = _digits_right_to_left(a, width), _digits_right_to_left(b, width)
    lines, carry = [], 0
    for i in range(width):
        total = da[i] + db[i] + carry
        expr = f"{da[i]} + {db[i]}" + (" + 1" if carry else "")
        carry = total // 10
        line = f"{PLACES[i]}: {expr} = {total}, write {total % 10}"
        lines.append(line + (", carry 1" if carry else ""))
    if carry:
        lines.append(f"{PLACES[width]}: write 1")
    return lines


def sub_lines(a: int, b: int) -> list[str]:
    """Column subtraction a - b for a >= b."""
    width = len(str(a))
    da, db = _digits_right_to_left(a, width), _digits_right_to_left(b, width)
    lines, borrow = [], 0
    for i in range(width):
        top = da[i] - borrow
        expr = f"{da[i]} - {db[i]}" + (" - 1" if borrow else "")
        if top < db[i]:
            lines.append(f"{PLACES[i]}: {expr} is negative, borrow: {top + 10} - {db[i]} = "
                         f"{top + 10 - db[i]}, write {top + 10 - db[i]}, borrow 1")
            borrow = 1
        else:
            lines.append(f"{PLACES[i]}: {expr} = {top - db[i]}, write {top - db[i]}")
            borrow = 0
    return lines


def reasoning(a: int, op: str, b: int) -> str:
    if op == "+":
        lines = [f"{a} + {b}, column by column from the right:"] + add_lines(a, b)
    elif a >= b:
        lines = [f"{a} - {b}, column by column from the right:"] + sub_lines(a, b)
    else:
        lines = [f"{a} is less than {b}, so {a} - {b} = -({b} - {a}).",
                 f"{b} - {a}, column by column from the right:"] + sub_lines(b, a)
    result = a + b if op == "+" else a - b
    lines.append(f"So {a} {op} {b} = {result}.")
    return "\n".join(lines)


def sample_operand(rng: random.Random) -> int:
    n_digits = rng.choices([1, 2, 3], weights=[0.06, 0.47, 0.47])[0]
    return rng.randint(0 if n_digits == 1 else 10 ** (n_digits - 1), 10**n_digits - 1)


def question(rng: random.Random, a: int, op: str, b: int) -> str:
    return rng.choice(ADD_QUESTIONS if op == "+" else SUB_QUESTIONS).format(a=a, b=b)


def chat(rng: random.Random, a: int, op: str, b: int, thinking: bool) -> list[dict]:
    result = a + b if op == "+" else a - b
    answer = rng.choice(ANSWERS).format(a=a, b=b, op=op, r=result)
    return [{"role": "user", "content": question(rng, a, op, b)},
            {"role": "assistant", "reasoning_content": reasoning(a, op, b) if thinking else "",
             "content": answer}]


def heldout_questions(seed: int, n: int = 200) -> list[dict]:
    """n questions with 2-3 digit operands, half additions, half subtractions."""
    rng = random.Random(seed)
    seen, out = set(), []
    while len(out) < n:
        op = "+" if len(out) % 2 == 0 else "-"
        a, b = (rng.randint(10, 999) for _ in range(2))
        if (a, op, b) in seen:
            continue
        seen.add((a, op, b))
        out.append({"id": len(out), "a": a, "op": op, "b": b, "answer": a + b if op == "+" else a - b,
                    "messages": [{"role": "user", "content": question(rng, a, op, b)}],
                    "enable_thinking": True})
    return out


def train_chats(seed: int, n: int, heldout: list[dict], thinking_fraction: float = 0.8):
    """Yields n arithmetic chats (lists of messages) never asking a held-out (a, op, b)."""
    rng = random.Random(seed)
    excluded = {(q["a"], q["op"], q["b"]) for q in heldout}
    made = 0
    while made < n:
        a, b, op = sample_operand(rng), sample_operand(rng), rng.choice("+-")
        if (a, op, b) in excluded:
            continue
        messages = chat(rng, a, op, b, rng.random() < thinking_fraction)
        if rng.random() < 0.08:  # a follow-up question: teaches history handling
            a2, b2, op2 = sample_operand(rng), sample_operand(rng), rng.choice("+-")
            if (a2, op2, b2) not in excluded:
                messages = messages + chat(rng, a2, op2, b2, rng.random() < thinking_fraction)
        made += 1
        yield messages

"""Grade-school word problems for the demo model's corpus, with their worked solutions.

Six families in the style of the harness's problem generator (shopping totals and change,
sharing, hourly earnings, ages, two-leg distances, sale prices); each problem comes with two or
three calculation steps (`3 × 4 = 12`) and an answer sentence, so the corpus can render the same solution plainly, with bold, or as a list. Integer
answers only; everything is drawn from the `random.Random` passed in, so a seed fixes the problems.
"""

from __future__ import annotations

import random
from dataclasses import dataclass

NAMES = ["Maria", "Ben", "Aisha", "Tom", "Lena", "Omar", "Sofia", "Jack", "Mia", "Leo", "Nora", "Sam",
         "Priya", "Diego", "Emma", "Kai", "Zoe", "Ravi", "Lucy", "Noah", "Maya", "Jonas", "Kenji", "Amara"]
_GOODS = [("notebooks", "notebook"), ("pencils", "pencil"), ("apples", "apple"), ("stickers", "sticker"),
          ("markers", "marker"), ("cookies", "cookie"), ("books", "book"), ("balloons", "balloon")]
_EXTRAS = ["backpack", "lunch box", "ruler", "water bottle", "pencil case", "cap"]
_BATCHES = [("cookies", "trays"), ("marbles", "bags"), ("cards", "boxes"), ("muffins", "trays"),
            ("stickers", "packs"), ("crayons", "boxes")]
_JOBS = ["walking dogs", "babysitting", "washing cars", "mowing lawns", "tutoring"]
_RELATIVES = ["cousin", "sister", "brother", "aunt", "uncle"]
_UNITS = [("kilometres", "km"), ("miles", "miles")]
_SALE = ["bike", "jacket", "game", "lamp", "tent", "watch", "scooter"]


@dataclass(frozen=True)
class Step:
    expr: str   # "3 × 4 = 12"
    gloss: str  # "the notebooks cost $12"


@dataclass(frozen=True)
class Problem:
    family: str
    question: str
    steps: tuple[Step, ...]
    answer: int
    # The answer sentence with a `{n}` slot for the answer ("Maria spends {n} in all.") and the
    # answer as shown there ("$17"), so a style can bold just the number.
    sentence: str
    shown: str


def _shopping(rng: random.Random) -> Problem:
    name, (goods, _one), extra = rng.choice(NAMES), rng.choice(_GOODS), rng.choice(_EXTRAS)
    n, price, q = rng.randint(2, 9), rng.randint(2, 12), rng.randint(3, 30)
    cost = n * price
    total = cost + q
    if rng.random() < 0.5:
        question = (f"{name} buys {n} {goods} that cost ${price} each and a {extra} for ${q}. "
                    f"How much does {name} spend in all?")
        steps = (Step(f"{n} × {price} = {cost}", f"the {goods} cost ${cost}"),
                 Step(f"{cost} + {q} = {total}", f"with the {extra} the total is ${total}"))
        return Problem("shopping", question, steps, total, f"{name} spends {{n}} in all.", f"${total}")
    bill = (total // 10 + 1 + rng.randint(0, 2)) * 10
    change = bill - total
    question = (f"{name} buys {n} {goods} that cost ${price} each and a {extra} for ${q}. {name} pays "
                f"with ${bill}. How many dollars of change does {name} get back?")
    steps = (Step(f"{n} × {price} = {cost}", f"the {goods} cost ${cost}"),
             Step(f"{cost} + {q} = {total}", f"the bill is ${total}"),
             Step(f"{bill} - {total} = {change}", f"the change is ${change}"))
    return Problem("shopping", question, steps, change, f"{name} gets {{n}} back.", f"${change}")


def _sharing(rng: random.Random) -> Problem:
    name, (things, box) = rng.choice(NAMES), rng.choice(_BATCHES)
    groups, each = rng.randint(2, 8), rng.randint(3, 15)
    total = groups * each
    trays = rng.choice([d for d in (2, 3, 4, 5, 6) if total % d == 0 and d != groups] or [groups])
    per = total // trays
    who = rng.choice(["friends", "groups of friends", "classmates", "teams"])
    question = (f"{name} has {trays} {box} with {per} {things} in each and shares all of them equally "
                f"among {groups} {who}. How many {things} does each get?")
    steps = (Step(f"{trays} × {per} = {total}", f"there are {total} {things} in all"),
             Step(f"{total} ÷ {groups} = {each}", f"each of the {groups} gets {each}"))
    return Problem("sharing", question, steps, each, f"Each gets {{n}} {things}.", str(each))


def _rates(rng: random.Random) -> Problem:
    name, job = rng.choice(NAMES), rng.choice(_JOBS)
    rate, hours, days = rng.randint(5, 25), rng.randint(2, 8), rng.randint(2, 6)
    daily = rate * hours
    total = daily * days
    question = (f"{name} earns ${rate} per hour {job} and works {hours} hours a day for {days} days. "
                f"How many dollars does {name} earn in total?")
    steps = (Step(f"{rate} × {hours} = {daily}", f"{name} earns ${daily} each day"),
             Step(f"{daily} × {days} = {total}", f"over {days} days that is ${total}"))
    return Problem("rates", question, steps, total, f"{name} earns {{n}} in total.", f"${total}")


def _ages(rng: random.Random) -> Problem:
    name, rel = rng.choice(NAMES), rng.choice(_RELATIVES)
    age, older, later = rng.randint(3, 12), rng.randint(1, 8), rng.randint(2, 12)
    twice = 2 * age
    now = twice + older
    future = now + later
    question = (f"{name} is {age} years old. {name}'s {rel} is {older} years older than twice {name}'s age. "
                f"How old will the {rel} be in {later} years?")
    steps = (Step(f"2 × {age} = {twice}", f"twice {name}'s age is {twice}"),
             Step(f"{twice} + {older} = {now}", f"the {rel} is {now} now"),
             Step(f"{now} + {later} = {future}", f"in {later} years the {rel} will be {future}"))
    return Problem("ages", question, steps, future, f"The {rel} will be {{n}} years old.", str(future))


def _distance(rng: random.Random) -> Problem:
    name, (unit, short) = rng.choice(NAMES), rng.choice(_UNITS)
    v1, h1, v2, h2 = rng.randint(4, 12) * 5, rng.randint(2, 5), rng.randint(4, 12) * 5, rng.randint(1, 4)
    d1, d2 = v1 * h1, v2 * h2
    question = (f"{name}'s family drives at {v1} {short} per hour for {h1} hours, then at {v2} {short} per "
                f"hour for {h2} more hours. How many {unit} do they drive in all?")
    steps = (Step(f"{v1} × {h1} = {d1}", f"the first part is {d1} {short}"),
             Step(f"{v2} × {h2} = {d2}", f"the second part is {d2} {short}"),
             Step(f"{d1} + {d2} = {d1 + d2}", f"altogether it is {d1 + d2} {short}"))
    return Problem("distance", question, steps, d1 + d2, f"They drive {{n}} {unit} in all.", str(d1 + d2))


def _percent(rng: random.Random) -> Problem:
    name, item = rng.choice(NAMES), rng.choice(_SALE)
    pct = rng.choice([10, 20, 25, 30, 40, 50])
    price = rng.randint(2, 12) * 20
    off = price * pct // 100
    sale = price - off
    question = (f"A {item} costs ${price}. In a sale it is {pct}% off. How many dollars does {name} pay "
                f"for the {item} in the sale?")
    steps = (Step(f"{price} × {pct} ÷ 100 = {off}", f"the discount is ${off}"),
             Step(f"{price} - {off} = {sale}", f"{name} pays ${sale}"))
    return Problem("percent", question, steps, sale, f"{name} pays {{n}} for the {item}.", f"${sale}")


FAMILIES = {"shopping": _shopping, "sharing": _sharing, "rates": _rates, "ages": _ages,
            "distance": _distance, "percent": _percent}


def make_problem(rng: random.Random, family: str | None = None) -> Problem:
    return FAMILIES[family or rng.choice(sorted(FAMILIES))](rng)


def problems(n: int, seed: int) -> list[Problem]:
    """`n` problems from `seed`, families in turn (the same list on every machine)."""
    rng = random.Random(seed)
    fams = sorted(FAMILIES)
    return [make_problem(rng, fams[i % len(fams)]) for i in range(n)]

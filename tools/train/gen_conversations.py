#!/usr/bin/env python3
"""Seeded generator of synthetic long multi-session conversations with recall questions.

Two speakers with personas talk over several dated sessions ("[Session 3, May 2024]").
Each session mixes chit-chat with facts about the speakers (the name of a pet and of
relatives, job, employer, city, floor, birthday, numbers such as a commute or a weekly run,
travel plans, an instrument, a car). Later sessions mention facts again (by the owner or by
the other speaker), update them (a move, a new job, a new car, a changed trip) or contradict
them (the other speaker misremembers, the owner corrects). Several topics per session and
topics recurring over sessions give the conversation episodes. Third parties (a neighbour,
a colleague) bring distractor names, cities and jobs that are never asked about.

At the end come questions whose exact answers are facts from any earlier point, chosen so
that a good share (--far-share) of the answers were last stated far back (at least
--far-tokens tokens before the end of the conversation):

    [Questions]
    Q: What is Anna's dog called?
    A: Biscuit
    Q: Where did Tom move in May 2024?
    A: Lisbon

Output, one JSON object per line:
    {"seed", "split", "text", "tokens", "questions": [{"q", "a", "kind", "fact_position",
     "fact_token_position", "distance_tokens"}]}
"text" is the conversation only, ending in "\n"; training_text() appends the question
block and prompt_for() builds the evaluation prompt "...[Questions]\nQ: <q>\nA:".
fact_position is the character offset in "text" of the last mention that states the answer
(fact_token_position and distance_tokens: the same in tokens, counted with --tokenizer or
estimated at CHARS_PER_TOKEN characters per token without one).

Seeds: training uses [TRAIN_SEED_START, TRAIN_SEED_END), held-out evaluation uses
[HELDOUT_SEED_START, HELDOUT_SEED_END); the same seed and options always give the same
conversation. Standard library only (a tokenizer needs tools/train/tok.py).

    python3 tools/train/gen_conversations.py --split train --count 20000 --out train.jsonl
    python3 tools/train/gen_conversations.py --split heldout --count 200 \
        --min-tokens 2048 --max-tokens 3968 --tokenizer tok/tokenizer.model --out eval.jsonl
"""

import argparse
import json
import random
import sys

TRAIN_SEED_START, TRAIN_SEED_END = 0, 1_000_000_000
HELDOUT_SEED_START, HELDOUT_SEED_END = 2_000_000_000, 2_100_000_000
CHARS_PER_TOKEN = 3.3  # estimate without a tokenizer (BPE, 2048 pieces: 3.3-3.5)

QUESTIONS_HEADER = "[Questions]"

# ----------------------------------------------------------------------------- pools

FIRST_NAMES = """Anna Tom Maria Lukas Sofia Jonas Elena David Clara Felix Laura Simon Nina Oscar
Julia Marco Emma Leon Sara Hugo Mia Paul Lena Adam Eva Noah Ida Theo Alma Max Rosa Ben Vera
Karl Lisa Emil Greta Jan Hanna Otto Ella Finn Nora Ivan Lara Milan Alice Victor Zoe Samuel
Irene Pedro Marta Omar Yara Leo Dana Rafael Inga Tobias Helen Martin Olga Arthur Frida Dennis
Petra Oliver Carla Henry Agnes Robert Lucia Erik Daria Tim Berta Nils Selma Kevin Judith Amir
Fiona Bruno Heidi Ciro Kira Dario Luisa Elias Mona Fabian Tessa George Wanda Igor Esther Luca
Paula Moritz Anja Rico Sabine Stefan Ines Ralf Tilda Viktor Beatrix Axel Cora Gustav Elsa
Jakob Hilde Marek Ruth Nico Stella Quentin Xenia Malte Linnea Boris Ada Cyril Edith Filip
Gloria Henrik Iris Jasper Kaja Lorenz Merle Nestor Olivia Pia Ronja Sven Thea Ulrich Vilma
Walter Yusuf Zora Anton Britta Cosmo Doris Enzo Flora Gregor Hedda Ilse Joel Karin""".split()

PET_NAMES = """Biscuit Pepper Luna Mochi Rocky Pickles Waffles Ziggy Nugget Muffin Bruno Coco
Shadow Peanut Noodle Tofu Pumpkin Bubbles Gizmo Olive Pretzel Sprinkles Maple Cookie Dumpling
Sparky Whiskers Juniper Truffle Marble Button Pebble Snickers Fudge Rascal Bean Churro Kiwi
Mango Paprika Sushi Taco Waffle Zorro Banjo Cricket Domino Echo Fig Goblin Hazel Igloo Jellybean
Kettle Lentil Meatball Nacho Oreo Popcorn Quill Radish Saffron Tinker Umber Velvet Wasabi Yoyo
Bagel Crumpet Dusty Fritz Gumbo Hopper Inky Jasper Kobold Lulu Marzipan Nimbus Orzo Pixel
Ramen Sesame Tango Ulla Vanilla Walnut Acorn Basil Cinder Dorito Ember Flapjack Grits Hummus""".split()

SPECIES = ["dog", "cat", "parrot", "rabbit", "hamster", "turtle", "ferret", "goldfish"]

RELATIONS = ["sister", "brother", "cousin", "aunt", "uncle", "grandmother", "grandfather",
             "best friend", "nephew", "niece"]

CITIES = """Lisbon Porto Madrid Valencia Seville Bilbao Lyon Nantes Bordeaux Marseille Geneva
Zurich Basel Vienna Graz Munich Hamburg Leipzig Dresden Cologne Bremen Prague Brno Krakow Gdansk
Warsaw Vilnius Riga Tallinn Helsinki Turku Oslo Bergen Stockholm Malmo Uppsala Copenhagen Aarhus
Dublin Cork Galway Glasgow Leeds Bristol Cardiff York Brighton Utrecht Leiden Antwerp Ghent
Bruges Milan Turin Bologna Florence Naples Palermo Verona Trieste Ljubljana Zagreb Split Athens
Sofia Bucharest Budapest Bratislava Istanbul Izmir Cairo Tunis Rabat Dakar Nairobi Lagos Accra
Toronto Montreal Boston Denver Austin Seattle Chicago Portland Halifax Quebec Lima Quito Bogota
Santiago Havana Osaka Kyoto Seoul Busan Hanoi Manila Perth Hobart Auckland Wellington""".split()

JOBS = """nurse teacher architect baker pilot dentist plumber electrician librarian pharmacist
lawyer journalist photographer chef carpenter accountant firefighter translator gardener
mechanic veterinarian designer programmer tailor florist butcher surgeon paramedic engineer
economist geologist zookeeper barber painter sculptor sailor farmer locksmith optician
astronomer biologist chemist historian curator jeweller potter welder waiter bartender
courier dancer actor musician composer editor illustrator surveyor""".split()

COMPANIES = """Nordwind Bluecrest Orbitex Tallpine Greyfield Sunmark Ironbark Velora Quillon
Brightwave Stonegate Maplerise Cobaltix Fernhill Redwing Silverlake Lumora Driftwood Oakhaven
Kestrel Novalink Pinecliff Harborline Ambertech Westmoor Glacium Sablecore Tidewell Cresthaven
Zentara Bramblecom Halcyon Meridyne Northforge Opaline Riverton Solstice Thornbury Vantage
Wrenfield""".split()

INSTRUMENTS = ["cello", "violin", "piano", "guitar", "trumpet", "flute", "saxophone", "drums",
               "clarinet", "harp", "ukulele", "accordion", "banjo", "oboe", "trombone",
               "mandolin"]

COLOURS = ["red", "blue", "green", "black", "white", "silver", "yellow", "orange", "grey",
           "brown", "purple", "beige"]

CAR_BRANDS = ["Volvo", "Toyota", "Skoda", "Fiat", "Renault", "Peugeot", "Honda", "Mazda",
              "Subaru", "Kia", "Hyundai", "Opel", "Seat", "Citroen", "Nissan", "Dacia", "Saab",
              "Lancia"]

MONTHS = ["January", "February", "March", "April", "May", "June", "July", "August",
          "September", "October", "November", "December"]

SHOWS = ["The Long Road", "Midnight Harbor", "Glass Kingdom", "The Quiet Farm", "Lost Signals",
         "Paper Moons", "The Last Ferry", "Salt and Stone", "Northern Lights", "Open Kitchen",
         "The Night Shift", "Hidden Valleys"]
FOODS = ["lasagna", "curry", "soup", "risotto", "pancake", "dumpling", "stew", "pie", "salad",
         "bread", "chili", "paella"]
WEATHER = ["rainy", "sunny", "windy", "freezing", "foggy", "humid", "stormy", "grey"]
DAYS = ["Monday", "Tuesday", "Wednesday", "Thursday", "Friday", "Saturday", "Sunday"]
ADJS = ["brilliant", "strange", "boring", "funny", "too long", "surprisingly good", "sad",
        "confusing"]

# ----------------------------------------------------------------------------- chit-chat

GREETINGS = ["Hi {Y}! How have you been?", "Hey {Y}, long time no see.",
             "Good to hear from you, {Y}.", "Morning {Y}! Do you have a minute to chat?",
             "Hello {Y}, how was your week?", "{Y}! I was just thinking about you.",
             "Hi there, {Y}. Is this a good time?"]
GREETING_REPLIES = ["Pretty good, thanks. It has been {weather} all week here.",
                    "Busy as always, but fine.", "Not bad at all. How about you, {Y}?",
                    "All good here, {Y}. Just tired.", "Great, thanks for asking!",
                    "Honestly a bit stressed, but happy to talk.",
                    "Fine, fine. The weather is {weather} again."]
SMALL_TALK = ["I watched {show} last night, it was {adj}.",
              "I tried a new {food} recipe yesterday.",
              "The weekend went by way too fast.", "I really need a holiday.",
              "Did you see the game on {day}?", "Traffic was terrible this morning.",
              "I finally cleaned out the garage.",
              "My phone died in the middle of a call again.",
              "Coffee is the only thing keeping me going today.",
              "It has been {weather} for days, I miss the sun.",
              "I made {food} for the whole family on {day}.",
              "Have you started watching {show}? Everyone talks about it.",
              "I slept for ten hours on {day}, it was amazing.",
              "We had a power cut on {day} and played cards all evening.",
              "I keep forgetting to water my plants.",
              "The supermarket was out of bread again."]
REACTIONS = ["Ha, that sounds like you.", "Oh nice!", "Wow, really?", "That's great news.",
             "Oh no, sorry to hear that.", "Sounds fun.", "Good for you!", "I can imagine.",
             "Tell me more.", "No way!", "That made me laugh.", "Fair enough.",
             "Same here, honestly.", "I know the feeling."]
CLOSINGS = ["I have to run, talk soon!", "Let's catch up again soon.", "Take care, {Y}.",
            "Bye for now!", "Sorry, dinner is ready. Speak soon!",
            "I should get back to work. Bye!"]
CLOSING_REPLIES = ["Bye {Y}!", "Talk soon.", "See you.", "Take care!", "Bye, and good luck!"]

TOPIC_CHAT = {
    "pets": ["Animals make everything more chaotic.", "The vet bills are unbelievable.",
             "Walks in the rain are the worst part.", "I found fur on my good jacket again.",
             "Pets are better than people sometimes."],
    "family": ["Family dinners are always loud.", "We should all meet up more often.",
               "Everyone in the family has an opinion about everything.",
               "I still have to buy presents for everyone."],
    "work": ["Meetings, meetings, meetings.", "My boss wants everything yesterday.",
             "At least the coffee at work is good.", "I'm counting the days until Friday."],
    "home": ["The neighbours are loud but friendly.", "Rent keeps going up.",
             "I still haven't unpacked all the boxes.", "The heating makes strange noises."],
    "travel": ["I already made a packing list.", "Flights are so expensive this year.",
               "I love exploring new places.", "We need to find a good hotel."],
    "hobbies": ["It's good to have something just for me.", "Practice is slow but fun.",
                "I try to keep one evening free for it.", "My friends think I'm obsessed."],
    "car": ["Parking in the city is a nightmare.", "Fuel prices are crazy.",
            "I should really wash it more often.", "The radio only gets two stations."],
}

PET_ACTS = ["chewed my shoes", "knocked over a plant", "escaped for an hour",
            "learned a new trick", "got a bath", "went to the vet", "slept all day",
            "woke me up at five"]
REL_ACTS = ["is visiting us next week", "just got engaged", "started a new course",
            "called me for two hours yesterday", "is coming over for dinner",
            "ran a half marathon", "helped me paint the kitchen", "lent me a tent"]

# ----------------------------------------------------------------------------- attributes
# Each attribute: topic, whether it can be updated, and templates. "{v}" is the value, "{w}"
# a wrong value, "{o}" the previous value, "{av}"/"{ao}"/"{aw}" the value with an article.

ATTRS = {
    "pet": dict(topic="pets", update=False, wrong=True),
    "rel": dict(topic="family", update=False, wrong=True),
    "job": dict(topic="work", update=True, wrong=True),
    "company": dict(topic="work", update=True, wrong=False),
    "commute": dict(topic="work", update=True, wrong=False),
    "city": dict(topic="home", update=True, wrong=True),
    "floor": dict(topic="home", update=False, wrong=False),
    "birthday": dict(topic="family", update=False, wrong=True),
    "trip": dict(topic="travel", update=True, wrong=True),
    "instrument": dict(topic="hobbies", update=False, wrong=False),
    "run_km": dict(topic="hobbies", update=True, wrong=False),
    "books": dict(topic="hobbies", update=True, wrong=False),
    "car": dict(topic="car", update=True, wrong=False),
}
TOPICS = sorted({a["topic"] for a in ATTRS.values()})
TOPIC_ASK = {"pets": "the animals", "family": "your family", "work": "work", "home": "the flat",
             "travel": "the travel plans", "hobbies": "your hobbies", "car": "the car"}

INTRO = {
    "pet": ["We adopted a {species} recently. {v} is already the boss of the house.",
            "My {species} {v} has been keeping me busy.",
            "Did I ever tell you about my {species}? {v} is the sweetest thing.",
            "I got a {species} and named the little one {v}."],
    "rel": ["My {rel} {v} {rel_act}.", "I spent the weekend with my {rel}, {v}.",
            "You have never met my {rel} {v}, right? We are very close."],
    "job": ["I work as {av} these days.", "Work is busy. Being {av} is never boring.",
            "I have been working as {av} for a few years now."],
    "company": ["I work at {v}, the office is nice.", "My office at {v} just got renovated.",
                "Everyone at {v} is on holiday this week."],
    "commute": ["My commute takes {v} minutes each way.",
                "It takes me {v} minutes to get to work."],
    "city": ["Life in {v} is pretty calm.", "I live in {v}, so the weather is always a topic.",
             "Here in {v} everything closes early."],
    "floor": ["Our flat is on floor {v}, and the lift is broken again.",
              "I live on floor {v}, so the view is nice."],
    "birthday": ["My birthday is on {v}, by the way.",
                 "I'm planning a small party for my birthday on {v}."],
    "trip": ["We are planning a trip to {v} in {month}.",
             "I booked flights to {v} for {month}."],
    "instrument": ["I started taking {v} lessons.", "I'm learning to play the {v}."],
    "run_km": ["I run {v} kilometers every Sunday now.", "My Sunday run is {v} kilometers."],
    "books": ["I joined a reading challenge and I've read {v} books so far."],
    "car": ["I bought a {colour} {brand} last month.", "My {colour} {brand} broke down again."],
}
REPEAT_OWNER = {
    "pet": ["My {species} {v} {pet_act} yesterday.", "{v}, my {species}, {pet_act} this week."],
    "rel": ["My {rel} {v} {rel_act}.", "Guess what, my {rel} {v} {rel_act}."],
    "job": ["Long week at work, typical for {av}.", "As {av}, I get asked that a lot."],
    "company": ["There are rumours of a merger at {v}.", "{v} gave everyone a bonus."],
    "commute": ["The {v} minutes of commute are my podcast time."],
    "city": ["{v} is lovely this time of year.", "There was a festival in {v} last week."],
    "floor": ["Carrying groceries up to floor {v} is my workout."],
    "birthday": ["Only a few weeks until my birthday on {v}."],
    "trip": ["I'm reading guide books about {v} for our {month} trip."],
    "instrument": ["My {v} teacher says I'm improving.", "I practised the {v} every evening."],
    "run_km": ["The {v} kilometers on Sunday felt easy this time."],
    "books": ["Still at {v} books, I've been too busy to read."],
    "car": ["My {colour} {brand} needs new tyres."],
}
REPEAT_OTHER = {
    "pet": ["How is your {species} {v} doing?", "Say hi to {v} for me.",
            "Give {v} a treat from me!"],
    "rel": ["How is {v}, your {rel}?", "Did your {rel} {v} enjoy the visit?"],
    "job": ["How is life as {av}?", "Are you still enjoying the work as {av}?"],
    "company": ["How are things at {v}?"],
    "commute": ["Is the commute still {v} minutes?"],
    "city": ["How do you like {v}?", "Is it still cold in {v}?"],
    "floor": ["Is the lift on floor {v} fixed yet?"],
    "birthday": ["Your birthday is on {v}, right? I wrote it down."],
    "trip": ["Are you excited about {v} in {month}?"],
    "instrument": ["How are the {v} lessons going?"],
    "run_km": ["Still running {v} kilometers on Sundays?"],
    "books": ["{v} books already? Impressive."],
    "car": ["Is the {colour} {brand} running well?"],
}
UPDATE = {  # said by the owner; "{o}" is the old value
    "job": ["Big news: I quit being {ao} and started as {av}!",
            "I changed careers. I'm {av} now.", "I left my old job; now I work as {av}."],
    "company": ["I switched companies, I'm at {v} now.",
                "I left {o} and signed a contract with {v}."],
    "commute": ["My commute is {v} minutes now.", "With the new route my commute takes {v} minutes."],
    "city": ["We finally moved from {o} to {v}!", "Guess what, I moved to {v} last week.",
             "I live in {v} now, the move was exhausting."],
    "trip": ["Change of plans: we are going to {v} in {month} instead of {o}.",
             "We cancelled {o}. In {month} we are going to {v} now."],
    "run_km": ["My Sunday run is {v} kilometers now.",
               "I changed my Sunday run to {v} kilometers."],
    "books": ["Reading challenge update: {v} books done.",
              "I'm at {v} books in the reading challenge now."],
    "car": ["We sold the old {ocolour} {obrand} and bought a {colour} {brand}.",
            "I got a new car, a {colour} {brand}."],
}
WRONG_OTHER = {
    "pet": ["How is your {species} {w}?", "Is {w}, your {species}, still chewing everything?"],
    "rel": ["Is your {rel} {w} doing well?", "Did your {rel} {w} find a flat?"],
    "job": ["Still working as {aw}?"],
    "city": ["How is life in {w}?"],
    "birthday": ["Isn't your birthday on {w}?"],
    "trip": ["When do you leave for {w}?"],
}
WRONG_FIX = {
    "pet": ["{w}? You mean {v}! My {species} is called {v}.",
            "It's {v}, not {w}, but yes, my {species} is fine."],
    "rel": ["My {rel} is {v}, not {w}! But yes, all good.", "{w}? No, my {rel} is called {v}."],
    "job": ["No, I'm {av}, remember?"],
    "city": ["I live in {v}, not {w}!"],
    "birthday": ["No, it's on {v}."],
    "trip": ["It's {v}, not {w}! We go in {month}."],
}
OTHER_REACT_UPDATE = {
    "job": ["Wow, {av}? That is a big change."],
    "city": ["{v}! I have always wanted to visit."],
    "car": ["A {colour} {brand}, nice choice."],
}

QUESTIONS = {  # (kind, attribute): templates; "{P}" is the owner's name
    ("current", "pet"): ["What is {P}'s {species} called?", "What is the name of {P}'s {species}?"],
    ("current", "rel"): ["What is the name of {P}'s {rel}?", "What is {P}'s {rel} called?"],
    ("current", "job"): ["What does {P} do for a living now?", "What is {P}'s job now?"],
    ("current", "company"): ["Which company does {P} work for now?"],
    ("current", "commute"): ["How many minutes is {P}'s commute now?"],
    ("current", "city"): ["Where does {P} live now?", "Which city does {P} live in now?"],
    ("current", "floor"): ["On which floor is {P}'s flat?"],
    ("current", "birthday"): ["When is {P}'s birthday?"],
    ("current", "trip"): ["Where is {P} planning to travel in {month}?"],
    ("current", "instrument"): ["Which instrument is {P} learning?"],
    ("current", "run_km"): ["How many kilometers does {P} run on Sundays now?"],
    ("current", "books"): ["How many books has {P} read for the reading challenge so far?"],
    ("current", "car_colour"): ["What colour is {P}'s car now?"],
    ("current", "car_brand"): ["What brand is {P}'s car now?"],
    ("previous", "job"): ["What was {P}'s job before becoming {anew}?"],
    ("previous", "company"): ["Which company did {P} work for before {new}?"],
    ("previous", "city"): ["Where did {P} live before moving to {new}?"],
    ("previous", "car_brand"): ["What brand was {P}'s car before the {new}?"],
    ("original", "trip"): ["Where was {P} first planning to travel in {month}?"],
    ("moved", "city"): ["Where did {P} move in {when}?", "Which city did {P} move to in {when}?"],
}


def article(word):
    return ("an " if word[0] in "aeiou" else "a ") + word


def render(template, fields):
    """Fills "{name}" placeholders; returns (text, {name: [offsets]})."""
    out, offsets, i = [], {}, 0
    pos = 0
    while True:
        j = template.find("{", i)
        if j < 0:
            out.append(template[i:])
            break
        k = template.index("}", j)
        out.append(template[i:j])
        pos += j - i
        name = template[j + 1:k]
        value = str(fields[name])
        if template.startswith("{", 0) and j == 0:
            value = value[0].upper() + value[1:]
        offsets.setdefault(name, []).append(pos)
        out.append(value)
        pos += len(value)
        i = k + 1
    return "".join(out), offsets


class Person:
    def __init__(self, name):
        self.name = name
        self.facts = {}       # key -> current value; key is an attribute or "rel:<relation>"
        self.history = {}     # key -> [(value, session label)]
        self.species = None
        self.trip_month = None


class Conversation:
    """Builds one conversation from `seed`; count_tokens(line) gives a line's token count."""

    def __init__(self, seed, min_tokens=1024, max_tokens=3968, count_tokens=None,
                 n_questions=8, far_tokens=600, far_share=0.75):
        self.rng = random.Random(seed)
        self.seed = seed
        self.count = count_tokens or (lambda line: int(len(line) / CHARS_PER_TOKEN) + 1)
        self.min_tokens, self.max_tokens = min_tokens, max_tokens
        self.n_questions, self.far_tokens, self.far_share = n_questions, far_tokens, far_share
        self.lines = []       # [(text, [(key_tuple, value, offset_in_line, truthful)])]
        self.used = set()     # every value placed in this conversation (no accidental reuse)
        self.moves = []       # (person, city, session label)

    # -- value pools --------------------------------------------------------------------
    def fresh(self, pool):
        for _ in range(1000):
            v = self.rng.choice(pool)
            if v not in self.used:
                self.used.add(v)
                return v
        raise RuntimeError("value pool exhausted")

    def fresh_number(self, lo, hi):
        return self.fresh([str(x) for x in range(lo, hi + 1)])

    def fresh_date(self):
        for _ in range(1000):
            v = f"{self.rng.choice(MONTHS)} {self.rng.randint(1, 28)}"
            if v not in self.used:
                self.used.add(v)
                return v
        raise RuntimeError("no date left")

    def new_value(self, person, key):
        attr = key.split(":")[0]
        if attr == "pet":
            return self.fresh(PET_NAMES)
        if attr == "rel":
            return self.fresh(FIRST_NAMES)
        if attr == "job":
            return self.fresh(JOBS)
        if attr == "company":
            return self.fresh(COMPANIES)
        if attr == "commute":
            return self.fresh_number(5, 95)
        if attr in ("city", "trip"):
            return self.fresh(CITIES)
        if attr == "floor":
            return self.fresh_number(2, 40)
        if attr == "birthday":
            return self.fresh_date()
        if attr == "instrument":
            return self.fresh(INSTRUMENTS)
        if attr == "run_km":
            return self.fresh_number(3, 42)
        if attr == "books":
            old = int(person.facts.get("books", "0"))
            return self.fresh_number(old + 1, old + 15)
        if attr == "car":
            return (self.fresh(COLOURS), self.fresh(CAR_BRANDS))
        raise KeyError(key)

    # -- lines --------------------------------------------------------------------------
    def say(self, speaker, template, fields, mentions=()):
        """Adds "speaker: text"; mentions: [(field, key_tuple, value, truthful)]."""
        text, offsets = render(template, fields)
        prefix = speaker.name + ": "
        recs = []
        for field, key, value, truthful in mentions:
            skip = len(str(fields[field])) - len(str(value)) if field in fields else 0
            for off in offsets.get(field, []):  # skip = an article before the value
                recs.append((key, value, len(prefix) + off + skip, truthful))
        self.lines.append((prefix + text, recs))

    def filler_fields(self, x, y):
        r = self.rng
        return dict(X=x.name, Y=y.name, weather=r.choice(WEATHER), show=r.choice(SHOWS),
                    food=r.choice(FOODS), day=r.choice(DAYS), adj=r.choice(ADJS))

    def fact_fields(self, person, key, value, wrong=None, old=None):
        attr = key.split(":")[0]
        f = dict(species=person.species, month=person.trip_month,
                 pet_act=self.rng.choice(PET_ACTS), rel_act=self.rng.choice(REL_ACTS))
        if attr == "rel":
            f["rel"] = key.split(":", 1)[1]
        if attr == "car":
            f["colour"], f["brand"] = value
            if old is not None:
                f["ocolour"], f["obrand"] = old
        else:
            f["v"] = value
            f["av"] = article(value)
            if wrong is not None:
                f["w"], f["aw"] = wrong, article(wrong)
            if old is not None:
                f["o"], f["ao"] = old, article(old)
        return f

    def fact_mentions(self, person, key, value, truthful=True, old=None, wrong=None):
        if key == "car":
            m = [("colour", (person.name, "car_colour"), value[0], truthful),
                 ("brand", (person.name, "car_brand"), value[1], truthful)]
            if old is not None:
                m += [("ocolour", (person.name, "car_colour"), old[0], True),
                      ("obrand", (person.name, "car_brand"), old[1], True)]
            return m
        m = [("v", (person.name, key), value, truthful), ("av", (person.name, key), value, truthful)]
        if old is not None:
            m += [("o", (person.name, key), old, True), ("ao", (person.name, key), old, True)]
        if wrong is not None:
            m += [("w", (person.name, key), wrong, False), ("aw", (person.name, key), wrong, False)]
        return m

    def set_fact(self, person, key, value, label):
        person.facts[key] = value
        person.history.setdefault(key, []).append((value, label))

    # -- events -------------------------------------------------------------------------
    def choose_kind(self, owner, key):
        attr = key.split(":")[0]
        if key not in owner.facts:
            return "intro"
        choices, weights = ["repeat_owner", "repeat_other"], [3, 2]
        if ATTRS[attr]["update"]:
            choices.append("update")
            weights.append(3)
        if ATTRS[attr]["wrong"]:
            choices.append("wrong")
            weights.append(2)
        return self.rng.choices(choices, weights)[0]

    def event(self, owner, other, key, label, kind):
        """Says one fact event of `kind`; returns the last speaker."""
        r = self.rng
        attr = key.split(":")[0]
        if kind == "intro":
            if attr == "pet":
                owner.species = r.choice(SPECIES)
            if attr == "trip":
                owner.trip_month = r.choice(MONTHS)
            value = self.new_value(owner, key)
            self.set_fact(owner, key, value, label)
            self.say(owner, r.choice(INTRO[attr]), self.fact_fields(owner, key, value),
                     self.fact_mentions(owner, key, value))
            return owner
        value = owner.facts[key]
        if kind == "repeat_owner":
            self.say(owner, r.choice(REPEAT_OWNER[attr]), self.fact_fields(owner, key, value),
                     self.fact_mentions(owner, key, value))
            return owner
        if kind == "repeat_other":
            self.say(other, r.choice(REPEAT_OTHER[attr]), self.fact_fields(owner, key, value),
                     self.fact_mentions(owner, key, value))
            return other
        if kind == "update":
            if attr == "city" and any(m[0] is owner and m[2] == label for m in self.moves):
                self.say(owner, r.choice(REPEAT_OWNER[attr]), self.fact_fields(owner, key, value),
                         self.fact_mentions(owner, key, value))
                return owner
            new = self.new_value(owner, key)
            self.set_fact(owner, key, new, label)
            self.say(owner, r.choice(UPDATE[attr]), self.fact_fields(owner, key, new, old=value),
                     self.fact_mentions(owner, key, new, old=value))
            if attr == "city":
                self.moves.append((owner, new, label))
                if "floor" in owner.facts:  # a new flat: the floor changes too
                    floor = self.new_value(owner, "floor")
                    self.set_fact(owner, "floor", floor, label)
                    self.say(owner, "The new flat is on floor {v}.",
                             self.fact_fields(owner, "floor", floor),
                             self.fact_mentions(owner, "floor", floor))
            if attr in OTHER_REACT_UPDATE and r.random() < 0.5:
                self.say(other, r.choice(OTHER_REACT_UPDATE[attr]),
                         self.fact_fields(owner, key, new), self.fact_mentions(owner, key, new))
                return other
            return owner
        # wrong: the other speaker misremembers, the owner corrects
        wrong = self.new_value(owner, key)
        f = self.fact_fields(owner, key, value, wrong=wrong)
        self.say(other, r.choice(WRONG_OTHER[attr]), f,
                 self.fact_mentions(owner, key, value, wrong=wrong))
        self.say(owner, r.choice(WRONG_FIX[attr]), f,
                 self.fact_mentions(owner, key, value, wrong=wrong))
        return owner

    def distractor(self, speaker):
        r = self.rng
        who = r.choice(["neighbour", "colleague", "friend from school", "dentist"])
        name = self.fresh(FIRST_NAMES)
        t = r.choice([("My {who} {n} just moved to {x}.", CITIES),
                      ("My {who} {n} got a {s} called {x}.", PET_NAMES),
                      ("My {who} {n} works as {ax} now.", JOBS),
                      ("My {who} {n} is learning the {x}.", INSTRUMENTS),
                      ("My {who} {n} flew to {x} last week.", CITIES)])
        x = self.fresh(t[1])
        text, _ = render(t[0], dict(who=who, n=name, x=x, ax=article(x), s=r.choice(SPECIES)))
        self.lines.append((speaker.name + ": " + text, []))

    def session(self, k, label):
        r = self.rng
        a, b = self.people if r.random() < 0.5 else self.people[::-1]
        self.lines.append((f"[Session {k}, {label}]", []))
        self.say(a, r.choice(GREETINGS), self.filler_fields(a, b))
        self.say(b, r.choice(GREETING_REPLIES), self.filler_fields(b, a))
        if r.random() < 0.6:
            self.say(a, r.choice(SMALL_TALK), self.filler_fields(a, b))
            self.say(b, r.choice(REACTIONS), self.filler_fields(b, a))
        for topic in r.sample(TOPICS, r.randint(2, 4)):
            owner = r.choice(self.people)
            other = self.people[1] if owner is self.people[0] else self.people[0]
            keys = [k for k in self.keys[owner.name] if ATTRS[k.split(":")[0]]["topic"] == topic]
            if not keys:
                continue
            for n, key in enumerate(r.sample(keys, min(len(keys), r.choice([1, 1, 2])))):
                kind = self.choose_kind(owner, key)
                if n == 0 and kind not in ("repeat_other", "wrong") and r.random() < 0.5:
                    self.say(other, "How is everything with " + TOPIC_ASK[topic] + "?", {})
                last = self.event(owner, other, key, label, kind)
                if last is owner and r.random() < 0.6:
                    self.say(other, r.choice(REACTIONS), self.filler_fields(other, owner))
            for _ in range(r.randint(0, 2)):
                speaker = r.choice(self.people)
                self.say(speaker, r.choice(TOPIC_CHAT[topic] + SMALL_TALK),
                         self.filler_fields(speaker, a if speaker is b else b))
            if r.random() < 0.2:
                self.distractor(r.choice(self.people))
        self.say(a, r.choice(CLOSINGS), self.filler_fields(a, b))
        self.say(b, r.choice(CLOSING_REPLIES), self.filler_fields(b, a))

    # -- whole conversation -------------------------------------------------------------
    def build(self):
        r = self.rng
        self.people = [Person(self.fresh(FIRST_NAMES)), Person(self.fresh(FIRST_NAMES))]
        self.keys = {}
        for p in self.people:
            attrs = r.sample([a for a in ATTRS if a != "rel"], r.randint(6, 10))
            rels = [f"rel:{x}" for x in r.sample(RELATIONS, r.randint(1, 3))]
            self.keys[p.name] = attrs + rels
        target = r.randint(min(self.min_tokens, self.max_tokens), self.max_tokens)
        month, year = r.randrange(12), r.randint(2015, 2024)
        total, k, attempts = 0, 0, 0
        while total < target and attempts < 100:
            attempts += 1
            k += 1
            label = f"{MONTHS[month]} {year}"
            state = self.snapshot()
            start = len(self.lines)
            self.session(k, label)
            added = sum(self.count(t) for t, _ in self.lines[start:])
            if total + added > self.max_tokens:
                self.restore(state)
                del self.lines[start:]
                if total >= self.min_tokens:
                    break
                k -= 1
                continue
            total += added
            step = r.randint(1, 3)
            month, year = (month + step) % 12, year + (month + step) // 12
        return self.finish(total)

    def snapshot(self):
        return ({p.name: ({k: v for k, v in p.facts.items()},
                          {k: list(v) for k, v in p.history.items()}, p.species, p.trip_month)
                 for p in self.people}, set(self.used), list(self.moves))

    def restore(self, state):
        people, self.used, self.moves = state
        for p in self.people:
            facts, history, p.species, p.trip_month = people[p.name]
            p.facts, p.history = dict(facts), {k: list(v) for k, v in history.items()}

    def finish(self, total_tokens):
        text_parts, positions, token_pos = [], {}, 0
        char_pos = 0
        line_tokens = []
        for line, recs in self.lines:
            n = self.count(line)
            for key, value, off, truthful in recs:
                if truthful:
                    tok = token_pos + self.count(line[:off]) - 1 if off else token_pos
                    positions[(key, value)] = (char_pos + off, tok)
            text_parts.append(line + "\n")
            char_pos += len(line) + 1
            token_pos += n
            line_tokens.append(n)
        text = "".join(text_parts)
        questions = self.questions(positions, token_pos)
        return dict(seed=self.seed, text=text, tokens=token_pos, questions=questions)

    def questions(self, positions, total_tokens):
        r = self.rng
        cands = []

        def add(kind, attr_q, person, key, answer, **extra):
            pos = positions.get(((person.name, key), answer))
            if pos is None:
                return
            fields = dict(P=person.name, species=person.species, month=person.trip_month,
                          **extra)
            if key.startswith("rel:"):
                fields["rel"] = key.split(":", 1)[1]
            q = r.choice(QUESTIONS[(kind, attr_q)]).format(**fields)
            cands.append(dict(q=q, a=answer, kind=f"{kind}:{attr_q}", fact_position=pos[0],
                              fact_token_position=pos[1],
                              distance_tokens=total_tokens - pos[1]))

        for p in self.people:
            for key, hist in p.history.items():
                attr = key.split(":")[0]
                if attr == "car":
                    add("current", "car_colour", p, "car_colour", hist[-1][0][0])
                    add("current", "car_brand", p, "car_brand", hist[-1][0][1])
                    if len(hist) > 1 and hist[-2][0][1] != hist[-1][0][1]:
                        add("previous", "car_brand", p, "car_brand", hist[-2][0][1],
                            new=hist[-1][0][1])
                    continue
                add("current", attr, p, key, hist[-1][0])
                if len(hist) > 1 and ("previous", attr) in QUESTIONS:
                    add("previous", attr, p, key, hist[-2][0], new=hist[-1][0],
                        anew=article(hist[-1][0]))
                if len(hist) > 1 and attr == "trip":
                    add("original", attr, p, key, hist[0][0])
        for person, city, label in self.moves:
            add("moved", "city", person, "city", city, when=label)
        # One question per question text; far answers first up to far_share.
        seen, unique = set(), []
        for c in cands:
            if c["q"] not in seen:
                seen.add(c["q"])
                unique.append(c)
        r.shuffle(unique)
        far = [c for c in unique if c["distance_tokens"] >= self.far_tokens]
        near = [c for c in unique if c["distance_tokens"] < self.far_tokens]
        n_far = min(len(far), round(self.n_questions * self.far_share))
        chosen = far[:n_far]
        rest = near + far[n_far:]
        r.shuffle(rest)
        chosen += rest[:self.n_questions - len(chosen)]
        r.shuffle(chosen)
        return chosen


def generate(seed, **kw):
    return Conversation(seed, **kw).build()


def training_text(conv, questions=None):
    """The conversation followed by its question block with answers (the training format)."""
    qs = conv["questions"] if questions is None else questions
    return conv["text"] + QUESTIONS_HEADER + "\n" + "".join(
        f"Q: {q['q']}\nA: {q['a']}\n" for q in qs)


def prompt_for(text, question):
    """The evaluation prompt for one question; the model should continue " <answer>\n"."""
    return text + QUESTIONS_HEADER + "\n" + f"Q: {question}\nA:"


def seed_range(split):
    return (TRAIN_SEED_START, TRAIN_SEED_END) if split == "train" else \
        (HELDOUT_SEED_START, HELDOUT_SEED_END)


def main():
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("--split", choices=["train", "heldout"], default="train")
    ap.add_argument("--start", type=int, default=0, help="first seed offset within the split")
    ap.add_argument("--count", type=int, default=100)
    ap.add_argument("--min-tokens", type=int, default=1024)
    ap.add_argument("--max-tokens", type=int, default=3968,
                    help="conversation tokens at most (the questions come on top)")
    ap.add_argument("--questions", type=int, default=8)
    ap.add_argument("--far-tokens", type=int, default=600)
    ap.add_argument("--far-share", type=float, default=0.75)
    ap.add_argument("--tokenizer", help="tokenizer.model to count tokens exactly")
    ap.add_argument("--out", default="-")
    args = ap.parse_args()

    count = None
    if args.tokenizer:
        sys.path.insert(0, __file__.rsplit("/", 1)[0] if "/" in __file__ else ".")
        from tok import load_tokenizer
        tk = load_tokenizer(args.tokenizer)
        count = tk.line_tokens
    lo, hi = seed_range(args.split)
    out = sys.stdout if args.out == "-" else open(args.out, "w")
    for i in range(args.count):
        seed = lo + args.start + i
        if seed >= hi:
            raise SystemExit("seed range exhausted")
        conv = generate(seed, min_tokens=args.min_tokens, max_tokens=args.max_tokens,
                        count_tokens=count, n_questions=args.questions,
                        far_tokens=args.far_tokens, far_share=args.far_share)
        conv["split"] = args.split
        out.write(json.dumps(conv) + "\n")
    if out is not sys.stdout:
        out.close()


if __name__ == "__main__":
    main()

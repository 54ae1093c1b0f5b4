"""Instruction-following training data: short writing requests, each with one to three verifiable constraints.

    python data/instruction_task.py                    # rewrites data/instructions/{train,test}.jsonl (seed 0)
    python data/instruction_task.py OUT --seed 1 --train 4000 --test 400

Rows are in IFEval's layout ({"key", "prompt", "instruction_id_list", "kwargs"}), scored by the rewards ifeval,
ifeval_loose, ifeval_all and ifeval_all_loose (alignment/rewards/instructions.py) with IFEval's own verifiers.

The requests and the wording of every constraint are written here for this project (covered by its license): nothing
is taken from IFEval's or IFBench's prompts, whose evaluation they must stay apart from (tests/rewards/test_instruction_data.py
checks that no 8-word sequence is shared with either). The constraint types are IFEval's, less
language:response_language (a 135M English model writes no other language) and detectable_format:constrained_response
(its fixed yes/no/maybe answers fit no writing request here); their arguments are drawn over ranges, and pairs
that IFEval's registry marks as contradicting each other (lowercase with capitals, JSON with bullet points...) are
never drawn together.
"""

import argparse
import json
import random
from pathlib import Path

REQUESTS = [
    "Write a short story about {topic}.", "Write a poem about {topic}.", "Describe {topic} to someone who has never seen it.",
    "Explain why {topic} matters to people.", "Give advice to a beginner interested in {topic}.",
    "Write a short email to a friend about {topic}.", "Write a blog entry on {topic}.", "Share some facts about {topic}.",
    "Write a short essay on {topic}.", "Explain {topic} to a ten year old.", "Write a motivational note about {topic}.",
    "Write a diary entry about a day spent on {topic}.", "Write a speech for a school assembly about {topic}.",
    "Write a letter to your neighbour about {topic}.", "Tell me what you know about {topic}.",
    "Write a product description for {product}.", "Write a customer review of {product}.",
    "Write an advertisement for {product}.", "Explain how to choose {product}.", "Write a thank-you note for a gift: {product}.",
    "Write a song with two verses about {topic}.", "Write a limerick about {topic}.", "Write a funny rap about {topic}.",
    "Write a riddle whose answer is {topic}.", "Write a joke about {topic}.", "Write a dialogue between two friends about {topic}.",
    "Write a news report about {topic}.", "Write a short lesson plan for teaching {topic}.", "What are the pros and cons of {topic}?",
    "Can you help me write a social media post about {topic}?", "I am giving a talk on {topic} tomorrow. Write its opening.",
    "My cousin knows nothing about {topic}. How would you explain it to her?", "Write a cover letter for a job that involves {topic}.",
    "Write a travel itinerary for a weekend built around {topic}.", "Summarise what a newcomer should know about {topic}.",
    "Pretend you are a tour guide and talk about {topic}.", "Write a startup pitch for a company devoted to {topic}.",
    "Write a complaint letter about {product}.", "Compare {product} with a cheaper alternative.",
    "Write a story in which a child loses {product}.", "I am selling {product} online. Write the listing for me.",
]
TOPICS = [
    "learning to cook", "city gardens", "the history of bicycles", "ocean tides", "honey bees", "public libraries",
    "saving money", "a rainy afternoon", "mountain hiking", "recycling at home", "the moon", "old steam trains",
    "learning a new language", "a good night's sleep", "volunteering", "board games", "winter sports", "healthy breakfasts",
    "clouds", "desert animals", "music lessons", "working from home", "a small bakery", "the first day at a new job",
    "camping by a lake", "bird watching", "photography", "chess", "city parks", "electric cars", "rivers", "green tea",
    "friendship", "kindness to strangers", "time management", "a museum visit", "living with a cat", "walking a dog",
    "the night sky", "family farms", "bridges", "lighthouses", "volcanoes", "rain forests", "sending letters by post",
    "a school trip", "painting with watercolours", "running a marathon", "fixing a bicycle", "baking bread",
    "robots in factories", "the pyramids", "penguins", "the first snow of winter", "a birthday party",
    "moving to a new city", "street food", "drinking enough water", "growing tomatoes", "the seasons",
]
PRODUCTS = [
    "a reusable water bottle", "a pair of running shoes", "a desk lamp", "a school backpack", "a family board game",
    "a bicycle helmet", "a kitchen knife", "a coffee mug", "a pair of headphones", "a house plant", "a wool scarf",
    "a camping tent", "a paperback novel", "an alarm clock", "a garden hose", "a rain jacket",
]
WORDS = [
    "river", "window", "garden", "morning", "silver", "bridge", "candle", "forest", "pocket", "ladder", "orange", "winter",
    "market", "pencil", "thunder", "island", "basket", "mirror", "planet", "harbor", "ticket", "meadow", "engine", "castle",
]
ENDINGS = ["Have a great day.", "That is all for now.", "Thanks for reading.", "See you soon.", "Let me know what you think."]
# IFEval's relation -> the ways a request says it
RELATIONS = {"less than": ("fewer than", "less than", "under"), "at least": ("at least", "no fewer than", "a minimum of")}


def _relation(rng: random.Random) -> tuple:
    """(IFEval's relation, one wording of it)."""
    relation = rng.choice(tuple(RELATIONS))
    return relation, rng.choice(RELATIONS[relation])


def _ordinal(n: int) -> str:
    return {1: "first", 2: "second", 3: "third", 4: "fourth"}[n]


def _words(rng: random.Random, count: int) -> list:
    return rng.sample(WORDS, count)


def _plural(count: int) -> str:
    return "s" * (count != 1)


# instruction id -> draw(rng, request) -> (the constraint's wording, its kwargs as IFEval's verifier takes them). Each
# constraint has several wordings, so that training teaches the constraint rather than one sentence that states it.
def _keywords_existence(rng, request):
    words = _words(rng, rng.randint(1, 2))
    listed, quoted, s = " and ".join(words), "' and '".join(words), _plural(len(words))
    return rng.choice((f"Be sure to use the word{s} {listed}.", f"Include the keyword{s} '{quoted}' somewhere.",
                       f"Your answer has to mention {listed}.", f"Work the word{s} {listed} into the text.")), {"keywords": words}


def _keywords_frequency(rng, request):
    word, times, (relation, said) = rng.choice(WORDS), rng.randint(1, 3), _relation(rng)
    s = _plural(times)
    return rng.choice((f"The word '{word}' should appear {said} {times} time{s}.", f"Use the word {word} {said} {times} time{s}.",
                       f"Mention '{word}' {said} {times} time{s} in total.")), \
        {"keyword": word, "frequency": times, "relation": relation}


def _forbidden_words(rng, request):
    words = _words(rng, rng.randint(1, 2))
    s = _plural(len(words))
    return rng.choice((f"Never write the word{s} {' or '.join(words)}.", f"Avoid the word{s} {' or '.join(words)}.",
                       f"Do not include the keyword{s} {' and '.join(words)} in your answer.",
                       f"The word{s} {' and '.join(words)} must not appear anywhere.")), {"forbidden_words": words}


def _letter_frequency(rng, request):
    letter, times, (relation, said) = rng.choice("abdgkmpuwyz"), rng.randint(2, 8), _relation(rng)
    return rng.choice((f"Let the letter '{letter}' appear {said} {times} times.", f"Use the letter {letter} {said} {times} times.",
                       f"The letter {letter} should occur {said} {times} times in your reply.")), \
        {"letter": letter, "let_frequency": times, "let_relation": relation}


def _number_sentences(rng, request):
    count, (relation, said) = rng.randint(2, 8), _relation(rng)
    return rng.choice((f"Keep it to {said} {count} sentences.", f"Write {said} {count} sentences.",
                       f"Your whole answer should have {said} {count} sentences.")), {"num_sentences": count, "relation": relation}


def _number_paragraphs(rng, request):
    count = rng.randint(2, 4)
    return rng.choice((f"Write {count} paragraphs and put a line with only *** between one paragraph and the next.",
                       f"There should be exactly {count} paragraphs, divided from each other by the markdown divider ***.",
                       f"Use {count} paragraphs; separate them with ***.")), {"num_paragraphs": count}


def _number_words(rng, request):
    count, (relation, said) = rng.choice((30, 50, 80, 100, 120, 150)), _relation(rng)
    return rng.choice((f"Your reply must be {said} {count} words long.", f"Answer in {said} {count} words.",
                       f"Make it {said} {count} words.", f"The word count should be {said} {count}.")), \
        {"num_words": count, "relation": relation}


def _nth_paragraph_first_word(rng, request):
    count = rng.randint(2, 4)
    nth, word = rng.randint(1, count), rng.choice(WORDS)
    return rng.choice((f"Write {count} paragraphs, separated by blank lines; the {_ordinal(nth)} paragraph has to start with {word}.",
                       f"Use {count} paragraphs with two new lines between them, and begin paragraph {nth} with the word '{word}'.",
                       f"Give {count} paragraphs split by empty lines. Paragraph number {nth} must open with {word}.")), \
        {"num_paragraphs": count, "nth_paragraph": nth, "first_word": word}


def _number_placeholders(rng, request):
    count = rng.randint(1, 3)
    s = _plural(count)
    return rng.choice((f"Leave {count} blank{s} for the reader to fill in, written in square brackets like [date].",
                       f"Include {count} placeholder{s} in square brackets, such as [name].",
                       f"Put {count} bracketed placeholder{s} like [address] in the text.")), {"num_placeholders": count}


def _postscript(rng, request):
    marker = rng.choice(("P.S.", "P.P.S"))
    return rng.choice((f"After the main text, add a short note that begins with {marker}",
                       f"Close with a postscript that opens with {marker}", f"Add a {marker} at the end.")), {"postscript_marker": marker}


def _bullet_lists(rng, request):
    count = rng.randint(2, 5)
    return rng.choice((f"Reply with {count} bullet points and nothing else, each line starting with '* '.",
                       f"Give exactly {count} bullet points, each a markdown line beginning with an asterisk.",
                       f"Format it as a list of exactly {count} markdown bullets (use * for each).")), {"num_bullets": count}


def _highlighted_sections(rng, request):
    count = rng.randint(1, 3)
    s = _plural(count)
    return rng.choice((f"Mark {count} important phrase{s} in bold-style markdown between single asterisks, like *this*.",
                       f"Highlight {count} part{s} of your answer with markdown, for example *an important part*.",
                       f"Use markdown to highlight {count} section{s}, such as *key idea*.")), {"num_highlights": count}


def _multiple_sections(rng, request):
    marker, count = rng.choice(("Section", "SECTION")), rng.randint(2, 3)
    return rng.choice((f"Organise the reply in {count} parts headed '{marker} 1', '{marker} 2' and so on.",
                       f"Split your answer into {count} sections. Start each with {marker} X, where X is its number.",
                       f"Your response needs {count} sections, marked {marker} 1, {marker} 2, and so on.")), \
        {"section_spliter": marker, "num_sections": count}


def _json_format(rng, request):
    return rng.choice(("Give the whole reply as valid JSON, optionally inside a ```json code block.",
                       "Wrap your entire output in JSON format.", "Format the complete answer as a JSON object.")), {}


def _title(rng, request):
    return rng.choice(("Start with a title placed in double angle brackets, such as <<A Fine Day>>.",
                       "Head your reply with a title set between << and >>, for example <<Morning Walk>>.",
                       "Include a title in the form <<title>>.")), {}


def _two_responses(rng, request):
    return rng.choice(("Write two different versions and separate them with a line of six asterisks: ******",
                       "Give me two different answers, separated by 6 asterisk symbols (******).",
                       "Provide two alternative replies and put ****** between them.")), {}


def _repeat_prompt(rng, request):
    return rng.choice(("Begin by copying my request exactly as written, then answer it.",
                       "Say my request back to me verbatim before you answer it.",
                       "Start your reply with my request repeated exactly, and only then respond to it.")), \
        {"prompt_to_repeat": request}


def _end_checker(rng, request):
    ending = rng.choice(ENDINGS)
    return rng.choice((f"The very last words of your reply must be: {ending}", f"Close your reply with exactly these words: '{ending}'",
                       f"End it with \"{ending}\" and say nothing after that.")), {"end_phrase": ending}


def _capital_word_frequency(rng, request):
    count, (relation, said) = rng.randint(1, 4), _relation(rng)
    s = _plural(count)
    return rng.choice((f"Use words written in all capital letters, like WOW, {said} {count} time{s}.",
                       f"Words in all caps should appear {said} {count} time{s}.",
                       f"Write {said} {count} word{s} entirely in capital letters for emphasis.")), \
        {"capital_frequency": count, "capital_relation": relation}


def _english_capital(rng, request):
    return rng.choice(("Write the reply in English using capital letters only.", "Your whole answer must be in English and in ALL CAPS.",
                       "Respond only in uppercase English letters.")), {}


def _english_lowercase(rng, request):
    return rng.choice(("Use only lowercase letters in the reply, with no capitals at all.",
                       "Your entire answer should be in English and all lowercase.",
                       "Write everything in small letters; capital letters are not allowed.")), {}


def _no_comma(rng, request):
    return rng.choice(("Do not put a single comma in your reply.", "Do not use any commas.", "Avoid commas entirely.",
                       "Write it without using any commas.", "Commas are not allowed in your answer.")), {}


def _quotation(rng, request):
    return rng.choice(("Put the entire reply between double quotation marks.", "Wrap your whole response in double quotes.",
                       "Enclose everything you write in double quotation marks.")), {}


CONSTRAINTS = {
    "keywords:existence": _keywords_existence, "keywords:frequency": _keywords_frequency,
    "keywords:forbidden_words": _forbidden_words, "keywords:letter_frequency": _letter_frequency,
    "length_constraints:number_sentences": _number_sentences, "length_constraints:number_paragraphs": _number_paragraphs,
    "length_constraints:number_words": _number_words, "length_constraints:nth_paragraph_first_word": _nth_paragraph_first_word,
    "detectable_content:number_placeholders": _number_placeholders, "detectable_content:postscript": _postscript,
    "detectable_format:number_bullet_lists": _bullet_lists, "detectable_format:number_highlighted_sections": _highlighted_sections,
    "detectable_format:multiple_sections": _multiple_sections, "detectable_format:json_format": _json_format,
    "detectable_format:title": _title, "combination:two_responses": _two_responses, "combination:repeat_prompt": _repeat_prompt,
    "startend:end_checker": _end_checker, "change_case:capital_word_frequency": _capital_word_frequency,
    "change_case:english_capital": _english_capital, "change_case:english_lowercase": _english_lowercase,
    "punctuation:no_comma": _no_comma, "startend:quotation": _quotation,
}


def conflicts() -> dict:
    """instruction id -> the ids IFEval's registry says contradict it (itself included)."""
    from alignment.rewards.instructions import verifiers

    verifiers()  # imports the registries as the rewards do (NLTK's downloader held off)
    from if_verifiable.ifeval.instructions_registry import INSTRUCTION_CONFLICTS

    return {key: set(value) for key, value in INSTRUCTION_CONFLICTS.items()}


def draw_row(rng: random.Random, key: int, contradicts: dict) -> dict:
    template = rng.choice(REQUESTS)
    request = template.format(topic=rng.choice(TOPICS), product=rng.choice(PRODUCTS))
    chosen = []
    for _ in range(rng.choice((1, 1, 2, 2, 3))):
        allowed = [i for i in CONSTRAINTS if all(i not in contradicts[c] and c not in contradicts[i] for c in chosen)]
        chosen.append(rng.choice(allowed))
    wordings, kwargs = zip(*(CONSTRAINTS[instruction](rng, request) for instruction in chosen))
    return {"key": key, "prompt": " ".join((request, *wordings)), "instruction_id_list": chosen, "kwargs": list(kwargs)}


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    parser.add_argument("out", nargs="?", default=str(Path(__file__).parent / "instructions"), help="folder (default data/instructions)")
    parser.add_argument("--seed", type=int, default=0, help="random seed (default 0)")
    parser.add_argument("--train", type=int, default=4000, help="training rows (default 4000)")
    parser.add_argument("--test", type=int, default=200, help="held-out rows (default 200), none of whose prompts is in train")
    args = parser.parse_args()
    rng, contradicts = random.Random(args.seed), conflicts()
    rows, seen = [], set()
    while len(rows) < args.train + args.test:
        row = draw_row(rng, len(rows), contradicts)
        if row["prompt"] not in seen:
            seen.add(row["prompt"])
            rows.append(row)
    out = Path(args.out)
    out.mkdir(parents=True, exist_ok=True)
    for name, part in (("train", rows[: args.train]), ("test", rows[args.train :])):
        with open(out / f"{name}.jsonl", "w") as f:
            f.writelines(json.dumps(row) + "\n" for row in part)
        print(f"wrote {len(part)} rows to {out / name}.jsonl")


if __name__ == "__main__":
    main()

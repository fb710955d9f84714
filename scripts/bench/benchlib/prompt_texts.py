"""The texts the benchmarks and the load test build their prompts from: short chat
questions, and topics for the numbered notes of long prompts."""

SHORT_QUESTIONS = [
    "What is the capital of France?",
    "Name three primary colors.",
    "Why is the sky blue?",
    "Give me a synonym for happy.",
    "How many legs does a spider have?",
    "What does a compiler do?",
    "Suggest a name for a gray cat.",
    "What is 12 times 12?",
    "Who wrote Romeo and Juliet?",
    "What is the boiling point of water?",
]
# A chat about one thing, each turn building on the last (bench-paged's ten turns,
# bench-prefix-cache's first four).
LIGHTHOUSE_TURNS = [
    "Tell me about lighthouses.",
    "Why were they painted in stripes?",
    "Who kept them running?",
    "How did the keepers get food?",
    "What did a keeper do on a stormy night?",
    "Which lighthouse is the oldest still standing?",
    "How far can its light be seen?",
    "What replaced the oil lamps?",
    "Are any lighthouses still staffed?",
    "Give me one sentence to remember them by.",
]
NOTE_TOPICS = [
    "the river level",
    "the bakery queue",
    "the train delays",
    "the garden soil",
    "the library hours",
    "the bridge repairs",
    "the market prices",
    "the school concert",
]
# Short questions about numbered notes, each after the same notes (bench-prefix-cache).
NOTES_QUESTIONS = [
    "Which note mentions the river?",
    "Summarize the notes in one line.",
    "What changed the most?",
    "Name one quiet week.",
    "Which topic comes up twice?",
    "What is the first note about?",
    "Give the last note's number.",
    "Is anything about bread?",
    "Which percent is the largest?",
    "Pick a note to read aloud.",
    "What happened on day 3?",
    "Are there more than ten notes?",
    "Which note is the shortest?",
    "Say one word about the notes.",
    "What would you ask next?",
    "Which note sounds odd?",
]

# Input-grounded requests (bench-speculative): the answer repeats much of the text
# it is given, so prompt lookup can guess it.
PASSAGES = [
    "The lighthouse on Gull Rock was built in 1871 from granite cut on the mainland. "
    "Its keeper climbed one hundred and twelve steps every evening to light the lamp, "
    "wound the clockwork that turned the lens every four hours, and wrote the wind, "
    "the sea and every passing ship in a leather log. In 1954 the light was automated "
    "and the last keeper, Ada Morrow, moved to the village, where she taught sailing "
    "to children until she was eighty.",
    "The stone bridge at Millford has five arches and crosses the river where the old "
    "ford used to be. Farmers paid a toll of one penny per cart until 1890, when the "
    "county bought the bridge and made it free. During the flood of 1912 the water "
    "rose to the top of the middle arch, but the bridge held, and the villagers "
    "carried food across it to the farms on the far bank for nine days.",
]
CODE_SNIPPETS = [
    "class Counter:\n"
    "    def __init__(self):\n"
    "        self.counts = {}\n\n"
    "    def add(self, word):\n"
    "        if word in self.counts:\n"
    "            self.counts[word] = self.counts[word] + 1\n"
    "        else:\n"
    "            self.counts[word] = 1\n\n"
    "    def most_common(self):\n"
    "        return max(self.counts, key=self.counts.get)\n",
    "def read_scores(path):\n"
    "    scores = []\n"
    "    with open(path) as file:\n"
    "        for line in file:\n"
    "            name, score = line.split(',')\n"
    "            scores.append((name, int(score)))\n"
    "    return scores\n",
]
GROUNDED_TASKS = [  # (template, which text): {text} is the passage or the code
    ("Repeat this passage word for word:\n\n{text}", "passage 0"),
    ("Summarise this passage:\n\n{text}", "passage 1"),
    (
        "Rewrite this code with the class renamed to WordCounter. Keep everything "
        "else the same.\n\n```python\n{text}```",
        "code 0",
    ),
    (
        "{text}\n\nAccording to the passage, who was the last keeper and what did "
        "she do after 1954?",
        "passage 0",
    ),
    ("Summarise this passage:\n\n{text}", "passage 0"),
    (
        "{text}\n\nAccording to the passage, what happened during the flood of 1912?",
        "passage 1",
    ),
    (
        "Add type hints to this function. Reply with the complete function.\n\n"
        "```python\n{text}```",
        "code 1",
    ),
    ("Repeat this passage word for word:\n\n{text}", "passage 1"),
]
# Open-ended chat (bench-speculative): nothing in the prompt to copy.
OPEN_QUESTIONS = [
    "Tell me a short story about a fox who learns to swim.",
    "Give me five tips for sleeping better.",
    "Explain how a bicycle stays upright.",
    "Why is the sky blue?",
    "Write a short poem about autumn rain.",
    "How do bees make honey?",
    "What should I pack for a weekend hiking trip?",
    "What does a compiler do?",
]

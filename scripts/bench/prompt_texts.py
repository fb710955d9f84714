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

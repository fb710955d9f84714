"""The prompts a draft head is trained on: open chat the model answers itself.

Templates times fillers, shuffled with a seed: stories, explanations, advice, lists,
poems and letters, none of them the benchmark's open questions
(scripts/bench/benchlib/prompt_texts.py OPEN_QUESTIONS), which stay held out.
"""

import itertools
import random

CHARACTERS = (
    "a lighthouse keeper", "a young baker", "an old sailor", "a lost cat",
    "a curious child", "a dragon", "a gardener", "a detective", "a shy owl",
    "a busy bee", "a retired astronaut", "a street musician", "a clever crow",
    "a night nurse", "a mountain guide", "a tiny snail", "a forgetful wizard",
    "a train driver", "a robot", "a beekeeper", "a polar bear", "a librarian",
)  # fmt: skip
STORY_TASKS = (
    "Tell me a short story about {}.",
    "Describe a day in the life of {}.",
    "Write a short poem about {}.",
    "What would {} say about friendship?",
    "Write a letter from {} to a friend.",
    "What is the biggest worry of {}?",
    "Write a diary entry by {}.",
    "Invent a fairy tale where {} saves the day.",
)
TOPICS = (
    "photosynthesis", "how rain forms", "the water cycle", "what a computer does",
    "how bread rises", "the moon's phases", "how plants grow", "why we sleep",
    "how magnets work", "what gravity is", "how birds fly", "what volcanoes are",
    "how the heart works", "how tides work", "what DNA is", "how vaccines work",
    "how a rainbow forms", "why leaves change colour", "how batteries store energy",
    "what clouds are made of", "how sound travels", "how fish breathe",
    "what a black hole is", "how the internet works", "what inflation is",
    "how a refrigerator works", "why the ocean is salty", "how earthquakes happen",
    "what a neural network is", "how muscles grow", "how coffee is made",
    "what recycling does", "how airplanes stay up", "what a database is",
)  # fmt: skip
TOPIC_TASKS = (
    "Explain {} in simple terms.",
    "Give me three facts about {}.",
    "Why is {} important?",
    "How would you teach {} to a child?",
    "What are common mistakes people make about {}?",
    "Write a short quiz about {}.",
    "Summarise {} in a paragraph.",
)
GOALS = (
    "learn to cook", "save money", "start running", "learn a new language",
    "keep a plant alive", "write a good email", "prepare for a job interview",
    "make new friends in a new city", "study for an exam", "stay focused at work",
    "plan a birthday party", "start a vegetable garden", "learn to draw",
    "clean a messy room quickly", "travel on a small budget", "take better photos",
)  # fmt: skip
GOAL_TASKS = (
    "How can I {}?",
    "Give me a step-by-step plan to {}.",
    "What are five tips to {}?",
    "What should a beginner know before trying to {}?",
)


def training_prompts(count: int, seed: int = 0) -> list[str]:
    """`count` distinct prompts (at most all the templates' fillings), shuffled
    with `seed`."""
    everything = [
        task.format(filler)
        for tasks, fillers in (
            (STORY_TASKS, CHARACTERS),
            (TOPIC_TASKS, TOPICS),
            (GOAL_TASKS, GOALS),
        )
        for task, filler in itertools.product(tasks, fillers)
    ]
    random.Random(seed).shuffle(everything)
    return everything[:count]

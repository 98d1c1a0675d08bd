"""A small sample corpus and questions for examples and tests (overlapping retrievals)."""

from __future__ import annotations

__all__ = ["SAMPLE_CORPUS", "SAMPLE_QUESTIONS"]

SAMPLE_CORPUS: dict[str, str] = {
    "eiffel": "The Eiffel Tower in Paris was completed in 1889 for the World's Fair. "
    "Gustave Eiffel's company built the iron tower, 330 metres tall today.",
    "louvre": "The Louvre in Paris is the world's most-visited museum. It holds the "
    "Mona Lisa and opened as a public museum in 1793, in a former royal palace.",
    "seine": "The Seine flows 777 km through Paris to the English Channel. Thirty-seven "
    "bridges cross it in Paris, the oldest standing one being the Pont Neuf.",
    "metro": "The Paris Metro opened in 1900 for the World's Fair. It has sixteen lines "
    "and carries over four million passengers a day.",
    "notre": "Notre-Dame cathedral in Paris reopened in December 2024, five years after "
    "the fire of April 2019 destroyed its roof and spire.",
    "orsay": "The Musée d'Orsay in Paris is a museum in a former railway station on the "
    "Seine; it holds impressionist paintings by Monet and Renoir.",
}

SAMPLE_QUESTIONS: list[str] = [
    "Which Paris museum holds the Mona Lisa?",
    "Which museum in Paris sits on the Seine?",
    "What was built in Paris for the World's Fair?",
    "Which bridges cross the Seine in Paris?",
]

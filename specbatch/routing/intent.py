"""What the wording of a prompt asks for, beyond its structure.

A graph or an option list is only half of a task: "explain Dijkstra on this graph" and
"write an essay on one of these topics: A. … B. …" carry the same structures as the
tasks the server answers with a canned reply, and a canned reply would ignore what they
ask. These readers find the phrases that decide it — a demand for more than a bare
answer, a request to choose one option, a request for an opinion — so the classifier can
send a prompt to a canned handler only when nothing in the wording asks for more.

Each reader returns the phrase it matched (for the routing reason) or ``None``. The
patterns are lower case and matched against lower-cased text: case-insensitive matching
in ``re`` is several times slower, and these run on every prompt.
"""

from __future__ import annotations

import functools
import re

_DEMAND_VERBS = (
    r"explain|justify|describe|discuss|compare|contrast|rank|sort|order\s+(?:the|these|them|all)|"
    r"rewrite|re-?word|write(?!\s+(?:down|only|just|your\s+(?:final\s+)?answer|the\s+(?:letter|answer|paths?)))|"
    r"compose|draft|create|generate|design|make(?!\s+sure)|invent|translate|summari[sz]e|paraphrase|"
    r"evaluate|assess|analy[sz]e|critique|elaborate|argue|debate|draw|plot|sketch|visuali[sz]e|"
    r"illustrate|implement|prove|derive|outline|brainstorm|convert|simulate|check|verify|grade|review|"
    r"proofread|add|modify|change|edit|improve|turn|transform|reformulate|rephrase|restate|shorten|expand|"
    r"simplify|fix|remove|delete|"
    r"tell\s+me\s+(?:why|how|about)|walk\s+me\s+through|teach"
)
_DEMAND_VERB = re.compile(rf"\b(?:{_DEMAND_VERBS})\b")
# What may stand right before a demand verb for it to be an imperative: the start of the
# text, a line, a sentence or a clause, or a conjunction or politeness marker ("... and
# explain", "For the question below, explain", "can you write"). "which best explains"
# is a question, not a demand.
_CLAUSE_LEAD = re.compile(
    r"(?:^|[\n.!?:;,][\s\"')\]*_]*|\b(?:and|then|also|please|can\s+you|could\s+you|would\s+you|"
    r"need\s+you\s+to|want\s+you\s+to|help\s+me|i'?d\s+like\s+you\s+to)\s+)"
    r"(?:briefly\s+|quickly\s+|carefully\s+)?[\s*_\"'(]*$",
    re.MULTILINE,
)
_LEAD_WINDOW = 40
_DEMAND_PHRASE = re.compile(
    r"\b(?:(?:with|and|plus|include|including|give|provide|add|along\s+with)\s+(?:a\s+|an\s+|your\s+|the\s+|"
    r"some\s+)?(?:\w+[\s-]+){0,2}?(?:explanation|justification|rationale|reasoning|reasons?|proof)"
    r"|show\s+(?:your|all|the)\s+(?:work|working|reasoning|steps|calculations?)"
    r"|step[\s-]+by[\s-]+step\s+(?:explanation|solution|walkthrough|derivation)"
    r"|(?:and|,)\s+why\b|pros\s+and\s+cons|for\s+each\s+(?:option|choice|answer|of\s+the)"
    r"|(?:select|choose|pick|mark|circle)\s+(?:all|every|each|two|three|both)\b|all\s+that\s+apply"
    r"|more\s+than\s+one\s+(?:correct\s+)?(?:answer|option)"
    r"|(?:give|provide|offer|want|need)\s+(?:me\s+)?(?:some\s+|your\s+)?feedback"
    r"|is\s+(?:that|this|it|my\s+answer)\s+(?:right|correct)"
    r"|(?:,\s*|\s)and\s+(?:what|why|how|who|where|when)\b|\bhints?\b|don'?t\s+(?:tell|give)\s+me\s+the\s+answer"
    r"|(?:answer|respond|reply|output|return|give|format|present)\b[^.\n]{0,40}?\b(?:in|as)\s+(?:a\s+)?"
    r"(?:json|yaml|xml|csv|table|markdown\s+table|bulleted\s+list|python\s+(?:list|dict))"
    r"|in\s+(?:\d+|one|two|three|a\s+few)\s+(?:words|sentences|paragraphs))",
)
_WRITE_QUESTIONS = re.compile(
    r"\b(?:write|create|generate|make|compose|draft|design|prepare|come\s+up\s+with|give\s+me|need|want)\b"
    r"[^.?!\n]{0,60}?\b(?:questions?|quiz(?:zes)?|mcqs?|test\s+items?|distractors|answer\s+options)\b",
)
_CHOICE = re.compile(
    r"\b(?:(?:answer|respond|reply)\s+(?:only\s+)?(?:with|using)\s+(?:only\s+|just\s+)?(?:the|a|one|a\s+single)\s+"
    r"(?:\w+\s+)?(?:letter|option|choice)"
    r"|(?:choose|select|pick|identify|circle|mark|indicate)\s+(?:only\s+)?(?:the|one|an|a|your)?\s*"
    r"(?:\w+\s+)?(?:answer|option|choice|letter|one|response|alternative)"
    r"|(?:choose|select|pick|identify|circle)\s+(?:one|from|among|the|an?)\b"
    r"|which\s+(?:one\s+)?of\s+(?:the\s+following|these|those|the\s+(?:options|choices|answers))"
    r"|(?:your|the)\s+answer\s+(?:should|must)\s+be\s+(?:a\s+single|one|the)\s+(?:letter|option)"
    r"|(?:single|one)\s+letter|letter\s+(?:of|for)\s+the\s+(?:correct|best|right)"
    r"|the\s+answer\s+is\s+\(x\)|multiple[\s-]+choice\s+question)",
)
_OPINION = re.compile(
    r"\b(?:should\s+i|would\s+you\s+(?:pick|choose|prefer|recommend|rather|buy|take|go\s+with|vote)|do\s+you\s+(?:think|prefer|like|recommend)|your\s+(?:opinion|"
    r"favou?rite|thoughts|preference)|what\s+do\s+you\s+think|which\s+do\s+you|do\s+you\s+agree|"
    r"help\s+me\s+(?:choose|decide|pick)|who\s+is\s+right|i\s+(?:think|believe|chose|picked|answered)|"
    r"(?:says|said|claims?)\s+(?:that\s+)?the\s+answer\s+is)\b",
)
# Every branch of the pattern above holds one of these words; a stem without any (most of
# them) is ruled out by substring checks instead of the pattern's search.
_OPINION_WORDS = ("you", "should", "help", "right", "think", "believe", "chose", "picked", "answer")
# The opening of a sentence that speaks to the reader: an imperative or a request, perhaps
# after a short lead ("For the question below, explain …", "Can you rephrase …", "Please
# answer …"). "Review of systems …" names a finding, it asks nothing.
_DIRECTIVE_OPENING = re.compile(
    r"[\s\"'(*_#>-]*(?:(?:for|in|on|using|based\s+on)\b[^,.?!\n]{0,60},\s*)?"
    r"(?:(?:please|kindly|now|also|then|first|finally|just)\s+)*"
    r"(?:(?:can|could|would|will)\s+you\s+(?:please\s+)?|i\s+(?:need|want)\s+you\s+to\s+|"
    r"i'?d\s+like\s+you\s+to\s+|help\s+me\s+)?"
    rf"(?:don'?t|do\s+not|answer|respond|reply|give|tell|choose|select|pick|identify|find|provide|return|output|"
    rf"{_DEMAND_VERBS})\b(?!\s+of\b)"
)
# Quoted speech inside a vignette ('She asks, "Why me?"') is part of the question.
_QUOTED = re.compile(r"\"[^\"\n]*\"|“[^”\n]*”")
# Blanks after a sentence's end, or line breaks. The pattern opens on the blank and looks
# back at the stop: so written, ``re`` skips to the next blank instead of trying the
# look-behind at every character.
_SENTENCE_GAP = re.compile(r"\s(?<=[.!?:]\s)\s*|\n+")
# A second, open question appended to the one that asks for a letter and running to the
# end of the text: "…, and why?", "… — and why?", "…, and what is wrong with the other?".
# "… when and why the pain occurs?" and "… with exertion and when lying down?" go on with
# the same question.
_APPENDED_QUESTION = re.compile(
    r"(?:[,;]\s*|\s)(?:and|but)\s+(?:why|what|how|who|where|when)\b"
    r"(?=\s*\??$|\s+(?:is|are|was|were|do|does|did|would|should|could|can|will|might)\b[^.!?\n]*\??$)"
    r"|(?:—|–|\s-)\s*(?:and\s+)?(?:why|what|how)\b(?=\s*\??$)"
)
_APPENDED_QUESTION_REACH = 160
# What each branch of the pattern above must contain (in text with collapsed blanks, as the
# router passes it): most stems hold none of these near their end, and substring checks
# rule them out for a fraction of the pattern's search.
_APPENDED_QUESTION_JOINTS = ("and", "but", "—", "–", " -", "\n-")
_WHICH_QUESTION = re.compile(r"\bwhich\b[^?]*\?|\bwhat\s+is\s+the\s+(?:correct|right|best)\b[^?]*\?")


_CODE_BLOCK = re.compile(r"```.*?(?:```|$)", re.DOTALL)
_SENTENCE_BREAK = re.compile(r"[.!?](?=\s)")
_BLANK = re.compile(r"_{3,}|\bfill\s+in\s+the\s+blank")
# A stem that stops where the options take over: "... is", "... is:", "... caused by".
_DANGLING = re.compile(
    r"\b(?:is|are|was|were|be|by|of|the|an?|to|from|into|called|known\s+as|named)\s*[:…]?\s*$"
)
_INTERROGATIVE = re.compile(
    r"(?:which|what|who|whom|whose|where|when|why|how|is|are|was|were|does|do|did|can|could|will)\b"
)


def _found(pattern: re.Pattern[str], text: str) -> str | None:
    match = pattern.search(text.lower())
    return " ".join(match.group(0).split()) if match else None


def is_question(text: str) -> bool:
    """Whether the last sentence of ``text`` (code blocks aside) asks a question.

    It ends in "?", opens with an interrogative ("Which organelle produces ATP:"), leaves
    a blank to fill ("… is ____.") or breaks off for the options to complete it ("The
    language with the most speakers is:"); a preamble that merely contains a question
    further up does not count.
    """
    prose = _CODE_BLOCK.sub(" ", text.lower()).strip()
    if prose.endswith("?") or _BLANK.search(prose) or _DANGLING.search(prose):
        return True
    breaks = [match.end() for match in _SENTENCE_BREAK.finditer(prose)]
    last = prose[breaks[-1] :] if breaks else prose
    return _INTERROGATIVE.match(last.strip(" \t\n*_#\"'(")) is not None


def extra_demand(text: str) -> str | None:
    """A request for more than a bare answer: "explain", "justify", "write …", "show your work"."""
    lower = text.lower()
    for verb in _DEMAND_VERB.finditer(lower):
        if _CLAUSE_LEAD.search(lower, max(0, verb.start() - _LEAD_WINDOW), verb.start()):
            return verb.group(0)
    return _found(_DEMAND_PHRASE, lower)


# Texts up to this long are remembered (1024 of them at most, so the cache stays under a
# few MB whatever clients send); longer ones are read each time.
_REMEMBERED_CHARS = 2048


def asks_for_more(text: str) -> str | None:
    """More than a choice asked for in ``text``, the words around a question: a demand
    ("explain", "show your work"), a request to write questions, or a wish for an opinion.

    Remembered per text when short: what stands around a question repeats from prompt to
    prompt (the request rendering's preamble is one sentence per subject), and it is the
    costliest thing the router reads in a multiple-choice prompt.
    """
    return _remembered_demand(text) if len(text) <= _REMEMBERED_CHARS else _demand(text)


def _demand(text: str) -> str | None:
    return extra_demand(text) or asks_to_write_questions(text) or opinion_request(text)


_remembered_demand = functools.lru_cache(maxsize=1024)(_demand)


def asks_to_write_questions(text: str) -> str | None:
    """A request to author questions or a quiz, which mentions them without asking one."""
    return _found(_WRITE_QUESTIONS, text)


def choice_request(text: str) -> str | None:
    """Wording that asks the reader to pick one of the listed options."""
    return _found(_CHOICE, text)


def opinion_request(text: str) -> str | None:
    """Wording that asks for a preference, advice or a verdict on someone's answer.

    A scored letter does not say which of two people is right or what to weigh up.
    """
    return _found(_OPINION, text)


def choosing_question(after: str) -> bool:
    """Whether the text after an option list asks which option is right ("Which one lowers …?")."""
    return after.strip() == "?" or _WHICH_QUESTION.search(after.lower()) is not None


def open_question_after(after: str) -> str | None:
    """A question after the options that does not ask to choose one ("What factors matter?")."""
    if "?" not in after or choosing_question(after):
        return None
    return " ".join(after[: after.index("?") + 1].split()[-12:])


def _speaks_to_reader(sentence: str, final: bool, opinions: bool) -> bool:
    """An imperative or a request, a wish for an opinion (looked for only when the stem
    holds one: ``opinions``), or a question before the final one."""
    return (
        _DIRECTIVE_OPENING.match(sentence) is not None
        or (not final and sentence.endswith("?"))
        or (opinions and _OPINION.search(sentence) is not None)
    )


def instructions_in(stem: str) -> str:
    """The sentences of a question's stem that speak to the reader, one per line.

    A stem describes a patient, a study or a concept and then asks; its words ("a trial
    designed to evaluate", "short of breath with exertion and when lying down", "which
    best explains") are what the question is about, not what the prompt asks. A sentence
    that speaks to the reader — "Explain your answer.", "For the question below, describe
    …", "Can you rephrase this question?", "Which would you pick?" — is an instruction
    around the question even when it stands among the stem's lines, so only those are
    returned for the intent readers.
    """
    prose = stem.lower()
    if '"' in prose or "“" in prose:
        prose = _QUOTED.sub('""', prose)
    opinions = any(word in prose for word in _OPINION_WORDS) and _OPINION.search(prose) is not None
    sentences = [s for s in _SENTENCE_GAP.split(prose) if s]
    last = len(sentences) - 1
    return "\n".join(s for i, s in enumerate(sentences) if _speaks_to_reader(s, i == last, opinions))


def appended_question(text: str) -> str | None:
    """A second, open question tacked onto the end of ``text`` ("…, and why?").

    A letter answers the question it follows, not the one appended to it.
    """
    tail = text.rstrip()[-_APPENDED_QUESTION_REACH:].lower()
    if not any(joint in tail for joint in _APPENDED_QUESTION_JOINTS):
        return None
    return _found(_APPENDED_QUESTION, tail)

"""Our own minimal pairs, in BLiMP's format, generated from templates over words of the
default corpus.

    python -m minibert.evaluation.pair_templates --corpus data/pretrain/en \\
        --per-paradigm 250 --output data/minimal_pairs/en/pairs.jsonl

Each paradigm is a template with slots filled from a small hand-written lexicon (nouns
with their plurals, verbs with their forms, names with their gender); a word enters only
when it occurs at least ``--min-count`` times in the corpus (lower-cased), so the model
has seen every word it is asked about. The two sentences of a pair differ in one word
(the agreement, the verb form or the argument structure BLiMP's paradigm of the same name
tests, Warstadt et al. 2020, table 4), and every pair is drawn with ``--seed``. Published
minimal-pair sets stay out of the repository; these templates are ours.
"""
from __future__ import annotations

import argparse
import json
import sys
from collections import Counter
from pathlib import Path
from typing import Callable, Iterable

import numpy as np

# (singular, plural)
NOUNS = [("man", "men"), ("woman", "women"), ("child", "children"), ("dog", "dogs"),
         ("boy", "boys"), ("girl", "girls"), ("sailor", "sailors"), ("captain", "captains"),
         ("whale", "whales"), ("friend", "friends"), ("doctor", "doctors"),
         ("student", "students"), ("farmer", "farmers"), ("officer", "officers"),
         ("king", "kings"), ("horse", "horses"), ("writer", "writers"),
         ("teacher", "teachers"), ("soldier", "soldiers"), ("stranger", "strangers"),
         ("neighbor", "neighbors"), ("worker", "workers"), ("driver", "drivers"),
         ("player", "players"), ("boat", "boats"), ("house", "houses"), ("ship", "ships"),
         ("book", "books"), ("letter", "letters"), ("car", "cars"), ("tree", "trees"),
         ("picture", "pictures"), ("door", "doors"), ("window", "windows"),
         ("island", "islands"), ("city", "cities"), ("family", "families"),
         ("lady", "ladies"), ("wife", "wives"), ("knife", "knives")]
ANIMATE = {"man", "woman", "child", "dog", "boy", "girl", "sailor", "captain", "whale",
           "friend", "doctor", "student", "farmer", "officer", "king", "horse", "writer",
           "teacher", "soldier", "stranger", "neighbor", "worker", "driver", "player",
           "family", "lady", "wife"}
# intransitive: (3rd singular, plural, past)
INTRANSITIVE = [("sleeps", "sleep", "slept"), ("waits", "wait", "waited"),
                ("laughs", "laugh", "laughed"), ("works", "work", "worked"),
                ("smiles", "smile", "smiled"), ("arrives", "arrive", "arrived"),
                ("sings", "sing", "sang"), ("falls", "fall", "fell"),
                ("cries", "cry", "cried"), ("listens", "listen", "listened"),
                ("rests", "rest", "rested"), ("wins", "win", "won"),
                ("returns", "return", "returned"), ("stays", "stay", "stayed")]
# transitive: (3rd singular, plural, past)
TRANSITIVE = [("sees", "see", "saw"), ("likes", "like", "liked"), ("knows", "know", "knew"),
              ("finds", "find", "found"), ("follows", "follow", "followed"),
              ("helps", "help", "helped"), ("watches", "watch", "watched"),
              ("loves", "love", "loved"), ("hates", "hate", "hated"),
              ("meets", "meet", "met"), ("leaves", "leave", "left"),
              ("visits", "visit", "visited"), ("remembers", "remember", "remembered"),
              ("needs", "need", "needed")]
# verbs whose past tense and past participle differ: (past, participle)
IRREGULAR = [("broke", "broken"), ("went", "gone"), ("saw", "seen"), ("wrote", "written"),
             ("took", "taken"), ("gave", "given"), ("spoke", "spoken"), ("ate", "eaten"),
             ("fell", "fallen"), ("drove", "driven"), ("knew", "known"), ("began", "begun"),
             ("sang", "sung"), ("chose", "chosen"), ("forgot", "forgotten"),
             ("rose", "risen"), ("drew", "drawn"), ("flew", "flown"), ("grew", "grown"),
             ("threw", "thrown"), ("shook", "shaken"), ("stole", "stolen"), ("hid", "hidden"),
             ("rode", "ridden"), ("swam", "swum"), ("drank", "drunk"), ("ran", "run"),
             ("came", "come"), ("did", "done"), ("froze", "frozen")]
# past participles that can follow "had" with nothing after them
INTRANSITIVE_PARTICIPLE = {"broken", "gone", "written", "spoken", "eaten", "fallen",
                           "driven", "begun", "sung", "risen", "flown", "grown", "swum",
                           "drunk", "run", "come", "frozen", "hidden"}
# verbs that take no object: their simple past is tested without one
NO_OBJECT = {"gone", "fallen", "risen", "come"}
# the reflexive a gendered noun takes (other human nouns take either)
GENDER = {"man": "himself", "boy": "himself", "king": "himself", "woman": "herself",
          "girl": "herself", "lady": "herself", "wife": "herself"}
NAMES = {"he": ["John", "James", "Tom", "George", "Henry", "Charles", "Robert", "William"],
         "she": ["Mary", "Alice", "Helen", "Ruth", "Margaret", "Elizabeth", "Anne", "Jane"]}
REFLEXIVE = {"he": "himself", "she": "herself", "they": "themselves"}


def corpus_counts(lines: Iterable[str]) -> Counter:
    """Lower-cased word counts (the BERT basic tokenizer's words)."""
    from ..tokenization.basic import BasicTokenizer
    words = BasicTokenizer(do_lower_case=True).tokenize
    c: Counter = Counter()
    for line in lines:
        c.update(words(line))
    return c


class Lexicon:
    """The lexicon's entries whose every word occurs ``min_count`` times in ``counts``."""

    def __init__(self, counts: Counter, min_count: int = 5):
        ok = lambda *ws: all(counts[w.lower()] >= min_count for w in ws)  # noqa: E731
        self.nouns = [n for n in NOUNS if ok(*n)]
        self.animate = [n for n in self.nouns if n[0] in ANIMATE]
        self.iv = [v for v in INTRANSITIVE if ok(*v)]
        self.tv = [v for v in TRANSITIVE if ok(*v)]
        self.irregular = [v for v in IRREGULAR if ok(*v)]
        self.names = {g: [n for n in ns if ok(n)] for g, ns in NAMES.items()}
        for name, items in (("nouns", self.animate), ("intransitive verbs", self.iv),
                            ("transitive verbs", self.tv), ("irregular verbs", self.irregular),
                            ("male names", self.names["he"]),
                            ("female names", self.names["she"])):
            if len(items) < 3:
                raise ValueError(f"the corpus has only {len(items)} of the lexicon's {name} "
                                 f"at least {min_count} times; lower --min-count or give "
                                 "a larger corpus")


def _pick(rng, items):
    return items[int(rng.integers(len(items)))]


def _two(rng, items):
    i, j = rng.choice(len(items), 2, replace=False)
    return items[int(i)], items[int(j)]


def _cap(s: str) -> str:
    return s[0].upper() + s[1:]


# each paradigm: (UID, field, linguistics_term, draw(rng, lexicon) -> (good, bad))
def _det_noun(rng, lx):
    sg, pl = _pick(rng, lx.nouns)
    name = _pick(rng, lx.names[_pick(rng, ["he", "she"])])
    verb = _pick(rng, lx.tv)[2]
    if rng.integers(2):
        return f"{name} {verb} this {sg} .", f"{name} {verb} this {pl} ."
    return f"{name} {verb} these {pl} .", f"{name} {verb} these {sg} ."


def _det_adj_noun(rng, lx):
    sg, pl = _pick(rng, lx.nouns)
    adj = _pick(rng, ["old", "small", "new", "good", "little", "young"])
    if rng.integers(2):
        return f"That {adj} {sg} was here .", f"That {adj} {pl} was here ."
    return f"Those {adj} {pl} were here .", f"Those {adj} {sg} were here ."


def _sva(rng, lx):
    (sg, pl), (s3, p, _) = _pick(rng, lx.animate), _pick(rng, lx.iv)
    if rng.integers(2):
        return f"The {sg} {s3} .", f"The {sg} {p} ."
    return f"The {pl} {p} .", f"The {pl} {s3} ."


def _sva_distractor(rng, lx):
    (sg, pl), (sg2, pl2) = _two(rng, lx.nouns)
    s3, p, _ = _pick(rng, lx.iv)
    prep = _pick(rng, ["near", "behind", "beside", "with"])
    if rng.integers(2):
        return f"The {sg} {prep} the {pl2} {s3} .", f"The {sg} {prep} the {pl2} {p} ."
    return f"The {pl} {prep} the {sg2} {p} .", f"The {pl} {prep} the {sg2} {s3} ."


def _sva_relative(rng, lx):
    (sg, pl), (sg2, pl2) = _two(rng, lx.animate)
    s3, p, _ = _pick(rng, lx.iv)
    tv = _pick(rng, lx.tv)[2]
    if rng.integers(2):
        return f"The {sg} that the {pl2} {tv} {s3} .", f"The {sg} that the {pl2} {tv} {p} ."
    return f"The {pl} that the {sg2} {tv} {p} .", f"The {pl} that the {sg2} {tv} {s3} ."


def _there_be(rng, lx):
    sg, pl = _pick(rng, lx.nouns)
    place = _pick(rng, ["in the house", "on the island", "near the door", "in the city"])
    if rng.integers(2):
        return f"There was a {sg} {place} .", f"There were a {sg} {place} ."
    return f"There were many {pl} {place} .", f"There was many {pl} {place} ."


def _anaphor_gender(rng, lx):
    g, other = ("he", "she") if rng.integers(2) else ("she", "he")
    name = _pick(rng, lx.names[g])
    verb = _pick(rng, ["hurt", "saw", "helped", "loved", "hated", "knew", "blamed", "found",
                       "asked", "told"])
    return f"{name} {verb} {REFLEXIVE[g]} .", f"{name} {verb} {REFLEXIVE[other]} ."


def _anaphor_number(rng, lx):
    sg, pl = _pick(rng, [n for n in lx.animate if n[0] not in ("dog", "horse", "whale",
                                                                 "family")])
    verb = _pick(rng, ["hurt", "saw", "helped", "loved", "hated", "knew", "blamed", "found",
                       "asked", "told"])
    refl = GENDER.get(sg) or _pick(rng, ["himself", "herself"])
    if rng.integers(2):
        return f"The {pl} {verb} themselves .", f"The {pl} {verb} {refl} ."
    return f"The {sg} {verb} {refl} .", f"The {sg} {verb} themselves ."


def _past_tense(rng, lx):
    past, part = _pick(rng, lx.irregular)
    sg = _pick(rng, lx.animate)[0]
    when = _pick(rng, ["Yesterday", "Then", "Last night"])
    rest = " ." if part in NO_OBJECT else " it ."
    return f"{when} the {sg} {past}{rest}", f"{when} the {sg} {part}{rest}"


def _past_participle(rng, lx):
    past, part = _pick(rng, [v for v in lx.irregular if v[1] in INTRANSITIVE_PARTICIPLE]
                        or lx.irregular)
    sg = _pick(rng, lx.animate)[0]
    aux = _pick(rng, ["had", "has"])
    return f"The {sg} {aux} {part} .", f"The {sg} {aux} {past} ."


def _transitive(rng, lx):
    (sg, _), (obj, _) = _two(rng, lx.animate)
    return (f"The {sg} {_pick(rng, lx.tv)[2]} the {obj} .",
            f"The {sg} {_pick(rng, lx.iv)[2]} the {obj} .")


def _intransitive(rng, lx):
    sg = _pick(rng, lx.animate)[0]
    return f"The {sg} {_pick(rng, lx.iv)[2]} .", f"The {sg} {_pick(rng, lx.tv)[2]} ."


PARADIGMS: list[tuple[str, str, str, Callable]] = [
    ("determiner_noun_agreement", "morphology", "determiner_noun_agreement", _det_noun),
    ("determiner_noun_agreement_with_adjective", "morphology",
     "determiner_noun_agreement", _det_adj_noun),
    ("regular_subject_verb_agreement", "morphology", "subject_verb_agreement", _sva),
    ("distractor_agreement_prepositional_phrase", "morphology", "subject_verb_agreement",
     _sva_distractor),
    ("distractor_agreement_relative_clause", "morphology", "subject_verb_agreement",
     _sva_relative),
    ("existential_there_agreement", "morphology", "subject_verb_agreement", _there_be),
    ("anaphor_gender_agreement", "morphology", "anaphor_agreement", _anaphor_gender),
    ("anaphor_number_agreement", "morphology", "anaphor_agreement", _anaphor_number),
    ("irregular_past_tense", "morphology", "irregular_forms", _past_tense),
    ("irregular_past_participle", "morphology", "irregular_forms", _past_participle),
    ("transitive", "syntax", "argument_structure", _transitive),
    ("intransitive", "syntax", "argument_structure", _intransitive),
]


def generate(lexicon: Lexicon, per_paradigm: int, seed: int = 0) -> list[dict]:
    """``per_paradigm`` distinct pairs of every paradigm (fewer when the templates cannot
    make that many), BLiMP's fields plus ``pairID``, in paradigm order."""
    out = []
    for k, (uid, field, term, draw) in enumerate(PARADIGMS):
        rng = np.random.default_rng([seed, k])
        seen: set = set()
        for _ in range(per_paradigm * 20):
            good, bad = draw(rng, lexicon)
            if good == bad or (good, bad) in seen:
                continue
            seen.add((good, bad))
            out.append({"sentence_good": good, "sentence_bad": bad, "field": field,
                        "linguistics_term": term, "UID": uid, "pairID": str(len(seen) - 1)})
            if len(seen) == per_paradigm:
                break
    return out


def main(argv=None) -> int:
    from ..atomic import atomic_write_bytes
    from ..cli import fail, int_at_least
    from ..pretraining.corpus import CorpusError, iter_documents, resolve_corpus_files
    prog = "python -m minibert.evaluation.pair_templates"
    ap = argparse.ArgumentParser(prog=prog, description=__doc__.split("\n\n")[0])
    ap.add_argument("--corpus", nargs="+", required=True, help="text files or directories")
    ap.add_argument("--output", type=Path, required=True, help="the .jsonl to write")
    ap.add_argument("--per-paradigm", type=int_at_least(1), default=250)
    ap.add_argument("--min-count", type=int_at_least(1), default=5)
    ap.add_argument("--seed", type=int_at_least(0), default=0)
    args = ap.parse_args(argv)
    try:
        files = resolve_corpus_files(args.corpus)
        if args.output.resolve() in {f.resolve() for f in files}:
            raise ValueError(f"--output {args.output} is one of the --corpus files")
        counts = corpus_counts(s for doc in iter_documents(files) for s in doc)
        pairs = generate(Lexicon(counts, args.min_count), args.per_paradigm, args.seed)
        atomic_write_bytes(args.output, "".join(json.dumps(p) + "\n" for p in pairs)
                           .encode("utf-8"))
    except (CorpusError, ValueError, OSError) as e:
        fail(prog, str(e))
    print(f"wrote {len(pairs)} pairs of {len(PARADIGMS)} paradigms to {args.output}")
    return 0


if __name__ == "__main__":
    sys.exit(main())

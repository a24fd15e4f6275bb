"""WordNet glosses as a text classification data set with hashed sparse
features, for embedding-table examples (examples/wordnet_text.py).

Each synset of Debian's wordnet-base (/usr/share/wordnet/data.noun, .verb,
.adj, .adv; `apt-get install wordnet-base`) is one example: its gloss (the
text after " | ") is the input, its lexicographer file (lex_filenum, 00..44:
noun.animal, verb.motion, adj.all, ...) the label, 45 classes. The gloss is
lower-cased and split on non-alphanumerics; its features are every word and
every pair of adjacent words ("a b"), each a signed 64-bit id: the first 8
bytes of the BLAKE2b digest of its text, little-endian. The ids are the
keys of a sparse table as they are, or folded into buckets for a dense
embedding. A synset is a test example when the BLAKE2b hash of
"{pos}{offset}" ("n00001740") is 0 mod 10, so the split is the same on
every machine and run.

    train, test = load()         # Split(ids, offsets, labels) each
    ids, offsets, labels = train.batch(np.arange(256))

Parsing and hashing take a few seconds; the result is cached as a .npz in
~/.cache/harrier-data (or $HARRIER_DATA_CACHE), keyed by the data files'
sizes, so later runs load it in well under a second.
"""

import collections
import hashlib
import os
import re
import tempfile

import numpy as np

WORDNET_DIR = "/usr/share/wordnet"
NUM_CLASSES = 45
_POS = (("noun", "n"), ("verb", "v"), ("adj", "a"), ("adv", "r"))
_FORMAT = 1  # bump when the parsing or hashing changes
_TOKEN = re.compile(r"[a-z0-9]+")


def feature_id(text):
    """The signed 64-bit id of a feature's text ("word" or "word word")."""
    return int.from_bytes(hashlib.blake2b(text.encode(), digest_size=8).digest(),
                          "little", signed=True)


def is_test(pos, offset):
    """Whether synset `offset` (its 8-digit text) of `pos` ("n", "v", "a",
    "r") is in the test split."""
    digest = hashlib.blake2b(f"{pos}{offset}".encode(), digest_size=8).digest()
    return int.from_bytes(digest, "little") % 10 == 0


def tokens(gloss):
    return _TOKEN.findall(gloss.lower())


def features(words):
    """Unigram and adjacent-bigram texts of a token list, in order."""
    return words + [f"{a} {b}" for a, b in zip(words, words[1:])]


class Split(collections.namedtuple("Split", "ids offsets labels")):
    """Examples in CSR form: example i's feature ids are
    ids[offsets[i]:offsets[i + 1]] (offsets has len(labels) + 1 entries),
    its class labels[i]. All int64."""

    def __len__(self):
        return len(self.labels)

    def batch(self, index):
        """(ids, offsets, labels) of the examples `index` (an int array), in
        the form torch.nn.EmbeddingBag takes: offsets[j] is where example j
        starts in ids (len(index) entries, the first 0)."""
        index = np.asarray(index, dtype=np.int64)
        starts = self.offsets[index]
        lengths = self.offsets[index + 1] - starts
        offsets = np.zeros(len(index), dtype=np.int64)
        np.cumsum(lengths[:-1], out=offsets[1:])
        # Position k of the batch reads ids[starts[j] + (k - offsets[j])].
        positions = np.arange(int(lengths.sum()), dtype=np.int64)
        positions += np.repeat(starts - offsets, lengths)
        return self.ids[positions], offsets, self.labels[index]

    def subset(self, n, seed=0):
        """n examples drawn at random (fixed by `seed`), in their order here;
        all of them when n is 0 or more than there are."""
        if not n or n >= len(self):
            return self
        index = np.sort(np.random.default_rng(seed).permutation(len(self))[:n])
        ids, offsets, labels = self.batch(index)
        return Split(ids, np.append(offsets, len(ids)), labels)


def _paths(wordnet_dir):
    return [(os.path.join(wordnet_dir, f"data.{name}"), pos) for name, pos in _POS]


def parse(wordnet_dir=WORDNET_DIR):
    """Parses and hashes the four data files: (train, test) Splits, synsets
    in file order (nouns, verbs, adjectives, adverbs)."""
    ids_of = {}  # feature text -> id: each distinct text hashed once
    parts = {True: ([], [0], []), False: ([], [0], [])}
    for path, pos in _paths(wordnet_dir):
        with open(path, encoding="utf-8", errors="replace") as f:
            for line in f:
                if line.startswith(" "):  # the license header
                    continue
                head, sep, gloss = line.partition(" | ")
                if not sep:
                    continue
                fields = head.split(" ", 2)
                offset, label = fields[0], int(fields[1])
                row = []
                for text in features(tokens(gloss)):
                    value = ids_of.get(text)
                    if value is None:
                        value = ids_of[text] = feature_id(text)
                    row.append(value)
                ids, offsets, labels = parts[is_test(pos, offset)]
                ids.extend(row)
                offsets.append(len(ids))
                labels.append(label)

    def split(part):
        ids, offsets, labels = part
        return Split(np.array(ids, dtype=np.int64), np.array(offsets, dtype=np.int64),
                     np.array(labels, dtype=np.int64))
    return split(parts[False]), split(parts[True])


def _cache_path(wordnet_dir, cache_dir):
    sizes = "-".join(str(os.path.getsize(path)) for path, _ in _paths(wordnet_dir))
    key = hashlib.blake2b(f"{_FORMAT}:{os.path.abspath(wordnet_dir)}:{sizes}".encode(),
                          digest_size=6).hexdigest()
    return os.path.join(cache_dir, f"wordnet-text-{key}.npz")


def default_cache_dir():
    return os.environ.get("HARRIER_DATA_CACHE") or os.path.join(
        os.path.expanduser("~"), ".cache", "harrier-data")


def load(wordnet_dir=WORDNET_DIR, cache_dir=None):
    """(train, test) Splits, from the cache when it has them. Raises
    FileNotFoundError naming the package when the data files are missing.
    cache_dir="" parses without a cache."""
    for path, _ in _paths(wordnet_dir):
        if not os.path.exists(path):
            raise FileNotFoundError(f"{path} is missing: install Debian's wordnet-base "
                                    "(apt-get install wordnet-base)")
    if cache_dir is None:
        cache_dir = default_cache_dir()
    cached = _cache_path(wordnet_dir, cache_dir) if cache_dir else None
    if cached and os.path.exists(cached):
        with np.load(cached) as data:
            return (Split(data["train_ids"], data["train_offsets"], data["train_labels"]),
                    Split(data["test_ids"], data["test_offsets"], data["test_labels"]))
    train, test = parse(wordnet_dir)
    if cached:
        _save(cached, train, test)
    return train, test


def _save(path, train, test):
    """Writes the cache aside and renames it, so that workers starting
    together never read a half-written file. A cache that cannot be written
    (a read-only home) only means parsing again next time."""
    partial = None
    try:
        os.makedirs(os.path.dirname(path), exist_ok=True)
        fd, partial = tempfile.mkstemp(dir=os.path.dirname(path), suffix=".npz.partial")
        with os.fdopen(fd, "wb") as f:
            np.savez(f, train_ids=train.ids, train_offsets=train.offsets,
                     train_labels=train.labels, test_ids=test.ids,
                     test_offsets=test.offsets, test_labels=test.labels)
        os.chmod(partial, 0o644)
        os.replace(partial, path)
    except OSError:
        if partial and os.path.exists(partial):
            os.remove(partial)


def describe(train, test):
    """One line of figures: examples, feature occurrences, distinct ids."""
    distinct = len(np.unique(np.concatenate([train.ids, test.ids])))
    unseen = 1.0 - np.isin(test.ids, train.ids).mean() if len(test.ids) else 0.0
    return (f"train={len(train)} test={len(test)} classes={NUM_CLASSES} "
            f"features={len(train.ids) + len(test.ids)} distinct_ids={distinct} "
            f"test_ids_unseen_in_train={unseen:.3f}")


if __name__ == "__main__":
    train_split, test_split = load()
    print(describe(train_split, test_split))

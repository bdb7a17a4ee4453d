"""Glob matching in linear time: `*`, `?`, `[...]`, `**`, by simulating the pattern's automaton over a set of states.

Translating a glob to a backtracking regex (`*` -> `[^/]*`) costs exponential time on patterns like `*a*a*a...b`
against a long name of `a`s, inside one C call that holds the GIL. Here a pattern compiles to a list of tokens and
`match()` advances the set of positions the pattern could be at, one character at a time: at most
len(text) * 2 * (len(tokens) + 1) steps, whatever the pattern, in Python bytecode (so other threads get the GIL).

Syntax: `*` any run of characters but `/`; `?` one character but `/`; `[abc]`, `[a-z]`, `[!a-z]` / `[^a-z]` a class
(never matches `/`; a `]` right after the opening bracket or `!` is literal; a `[` that no `]` closes is literal);
`**` any run including `/`; `**/` zero or more whole directories. Everything else, backslash included, is literal.
A reversed range (`[z-a]`), a NUL byte or an over-long pattern is a `GlobError`.
"""

from __future__ import annotations

from dataclasses import dataclass

MAX_PATTERN_CHARS = 1024

# token kinds
LIT, ANY, CLASS, STAR, GLOBSTAR, DIRS = range(6)


class GlobError(ValueError):
    """The pattern is not a glob this matcher accepts (the caller answers 400)."""


@dataclass(frozen=True)
class Token:
    kind: int
    char: str = ""
    ranges: tuple[tuple[str, str], ...] = ()
    negated: bool = False

    def accepts(self, c: str) -> bool:
        """Whether this token consumes `c` and moves on (STAR/GLOBSTAR/DIRS loops are handled by the matcher)."""
        if self.kind == LIT:
            return c == self.char
        if self.kind == ANY:
            return c != "/"
        if self.kind == CLASS:
            if c == "/":
                return False
            inside = any(lo <= c <= hi for lo, hi in self.ranges)
            return inside != self.negated
        return False


def _parse_class(pattern: str, i: int) -> tuple[Token, int] | None:
    """`pattern[i]` is `[`; return the class token and the index after its `]`, or None when no `]` closes it
    (then the `[` is a literal, as in fnmatch)."""
    j = i + 1
    negated = j < len(pattern) and pattern[j] in "!^"
    if negated:
        j += 1
    ranges: list[tuple[str, str]] = []
    first = True
    while True:
        if j >= len(pattern):
            return None
        c = pattern[j]
        if c == "]" and not first:
            return Token(CLASS, ranges=tuple(ranges), negated=negated), j + 1
        first = False
        if j + 2 < len(pattern) and pattern[j + 1] == "-" and pattern[j + 2] != "]":
            lo, hi = c, pattern[j + 2]
            if lo > hi:
                raise GlobError(f"reversed range {lo}-{hi} in character class at {i}")
            ranges.append((lo, hi))
            j += 3
        else:
            ranges.append((c, c))
            j += 1


def compile_glob(pattern: str) -> list[Token]:
    if not pattern:
        raise GlobError("empty pattern")
    if len(pattern) > MAX_PATTERN_CHARS:
        raise GlobError(f"pattern is longer than {MAX_PATTERN_CHARS} characters")
    if "\x00" in pattern:
        raise GlobError("pattern contains a NUL byte")
    tokens: list[Token] = []
    i = 0
    while i < len(pattern):
        c = pattern[i]
        if pattern.startswith("**/", i):
            tokens.append(Token(DIRS))
            i += 3
        elif pattern.startswith("**", i):
            tokens.append(Token(GLOBSTAR))
            i += 2
        elif c == "*":
            if not tokens or tokens[-1].kind != STAR:  # `**`-free runs of stars are one star
                tokens.append(Token(STAR))
            i += 1
        elif c == "?":
            tokens.append(Token(ANY))
            i += 1
        elif c == "[" and (parsed := _parse_class(pattern, i)) is not None:
            token, i = parsed
            tokens.append(token)
        else:
            tokens.append(Token(LIT, char=c))
            i += 1
    return tokens


class Glob:
    """A compiled pattern; `match(text)` is True when the whole of `text` matches."""

    def __init__(self, pattern: str) -> None:
        self.pattern = pattern
        self.tokens = compile_glob(pattern)
        self.end = len(self.tokens)

    def _closure(self, states: set[int]) -> set[int]:
        """Add the positions reachable without consuming: past any star-like token (they all match empty)."""
        todo = list(states)
        while todo:
            s = todo.pop()
            if 0 <= s < self.end and self.tokens[s].kind in (STAR, GLOBSTAR, DIRS) and s + 1 not in states:
                states.add(s + 1)
                todo.append(s + 1)
        return states

    def match(self, text: str) -> bool:
        """States are token positions; `~s` (negative) is "inside the directories of the `**/` at s": it has
        consumed characters and can only leave through a `/`."""
        tokens, end = self.tokens, self.end
        states = self._closure({0})
        for c in text:
            nxt: set[int] = set()
            for s in states:
                if s < 0:  # inside `**/`: anything, and a `/` may end the directories
                    nxt.add(s)
                    if c == "/":
                        nxt.add(~s + 1)
                    continue
                if s == end:
                    continue
                tok = tokens[s]
                kind = tok.kind
                if kind == STAR:
                    if c != "/":
                        nxt.add(s)
                elif kind == GLOBSTAR:
                    nxt.add(s)
                elif kind == DIRS:  # `(.*/)?`: enter the directories (or end them at once on a `/`)
                    nxt.add(~s)
                    if c == "/":
                        nxt.add(s + 1)
                elif tok.accepts(c):
                    nxt.add(s + 1)
            if not nxt:
                return False
            states = self._closure(nxt)
        return end in states

"""The grammar sampler (llama.cpp's ``llama_sampler_init_grammar`` and its lazy variants) and the
common sampler's grammar-aware sampling (``common_sampler_sample``).

:class:`GrammarSampler` is exported as :class:`gguflm.samplers.Grammar`. On its own in a chain it
masks every candidate the grammar rejects (grammar first, as llama-cpp-python chains it);
:class:`GrammarChain` is what llama.cpp's common sampler does instead: sample with the chain,
check only the sampled token, and mask the whole vocabulary and sample again only when that token
is rejected.
"""

from __future__ import annotations

import re
import time
from collections.abc import Iterable, Sequence
from dataclasses import dataclass
from typing import Any

from gguflm.grammar.gbnf import GrammarError
from gguflm.grammar.grammar import CompiledGrammar, Grammar, GrammarState, GrammarVocab
from gguflm.candidates import LogitsSource, Sampler, TokenDataArray

__all__ = ["GrammarSampler", "GrammarChain", "GrammarTrigger", "TriggerPattern", "as_grammar",
           "grammar_sampler"]

# llama.cpp's characters to escape in a trigger word (common's regex_escape)
_REGEX_SPECIAL = re.compile(r"[.^$|()*+?\[\]{}\\]")


class TriggerPattern:
    """A lazy grammar's trigger (``llama_grammar_trigger_pattern``): a regular expression over the
    bytes generated so far. ``^...$`` patterns must match everything generated; others are
    searched for. The grammar starts at the first non-empty capture group (else at the match).

    Patterns are Python regular expressions on bytes; llama.cpp uses ECMAScript ``std::regex``,
    which agrees on the constructs trigger patterns use (``[\\s\\S]``, groups, alternation, ``*?``).
    """

    __slots__ = ("pattern", "_regex", "_full")

    def __init__(self, pattern: str) -> None:
        self.pattern = pattern
        try:
            self._regex = re.compile(pattern.encode("utf-8"))
        except re.error as err:
            raise GrammarError(f"bad trigger pattern {pattern!r}: {err}") from None
        self._full = pattern.startswith("^") and pattern.endswith("$")

    def find(self, text: bytes) -> int:
        """Where the constrained text starts, or -1 when the trigger has not fired."""
        if self._full and (m := self._regex.fullmatch(text)) is not None:
            return self._start(m)
        m = self._regex.search(text)
        return -1 if m is None else self._start(m)

    @staticmethod
    def _start(m: re.Match[bytes]) -> int:
        for i in range(1, (m.re.groups or 0) + 1):
            if m.start(i) >= 0 and m.end(i) > m.start(i):
                return m.start(i)
        return m.start(0)

    def __repr__(self) -> str:
        return f"TriggerPattern({self.pattern!r})"


@dataclass(frozen=True)
class GrammarTrigger:
    """llama.cpp's ``common_grammar_trigger``: what wakes a lazy grammar.

    ``type`` is ``"word"`` (``value`` appears anywhere), ``"pattern"`` (``value`` is a regular
    expression searched for), ``"pattern_full"`` (``value`` must match everything generated) or
    ``"token"`` (``token`` is generated).
    """

    type: str
    value: str = ""
    token: int = -1

    def as_pattern(self) -> str | None:
        """The trigger pattern llama.cpp's ``common_sampler_init`` makes of it (None: a token)."""
        if self.type == "word":
            return _REGEX_SPECIAL.sub(lambda m: "\\" + m.group(0), self.value)
        if self.type == "pattern":
            return self.value
        if self.type == "pattern_full":
            if not self.value:
                return "^$"
            return (("^" if not self.value.startswith("^") else "") + self.value
                    + ("$" if not self.value.endswith("$") else ""))
        if self.type == "token":
            return None
        raise ValueError(f"unknown grammar trigger type {self.type!r}")


def as_grammar(grammar: Any, root: str = "root") -> Grammar | None:
    """A :class:`Grammar` from what a caller may hand over: a Grammar, GBNF text, or
    llama-cpp-python's ``LlamaGrammar`` (its text and root). None and ``""`` are no grammar,
    as llama.cpp's grammar sampler with an empty grammar string."""
    if grammar is None:
        return None
    if isinstance(grammar, Grammar):
        if root != "root" and root != grammar.root:
            return Grammar(grammar.text, root)
        return grammar
    if isinstance(grammar, str):
        return Grammar(grammar, root) if grammar else None
    text = getattr(grammar, "_grammar", None)   # llama_cpp.LlamaGrammar
    if isinstance(text, str):
        return Grammar(text, getattr(grammar, "_root", "root")) if text else None
    raise TypeError(f"grammar must be a gguflm.Grammar or GBNF text, not {type(grammar).__name__}")


class GrammarSampler(Sampler):
    """Keep only tokens the grammar allows: llama.cpp's ``grammar`` sampler.

    Parameters
    ----------
    vocab
        The model's vocabulary (``model.vocab``).
    grammar
        A :class:`gguflm.Grammar` or GBNF text; None or ``""`` make a sampler that does nothing
        (as llama.cpp's with an empty grammar string).
    root
        The start rule.
    lazy
        Wait for a trigger before constraining (``llama_sampler_init_grammar_lazy_patterns``):
        until then every token passes and generated text is buffered; when a trigger fires, the
        buffered text from the trigger on is fed to the grammar.
    trigger_words, trigger_patterns, trigger_tokens
        The triggers: words (escaped into one pattern, as the deprecated
        ``llama_sampler_init_grammar_lazy``), regular expressions, token ids.

    Raises
    ------
    GrammarError
        The grammar does not parse or build (see :meth:`gguflm.Grammar.from_string`).
    """

    name = "grammar"

    def __init__(self, vocab: GrammarVocab, grammar: Grammar | str | None, root: str = "root", *,
                 lazy: bool = False, trigger_words: Iterable[str] = (),
                 trigger_patterns: Iterable[str] = (), trigger_tokens: Iterable[int] = ()) -> None:
        self.vocab = vocab
        self.grammar = as_grammar(grammar, root)
        words = [str(w) for w in trigger_words]
        patterns = [str(p) for p in trigger_patterns]
        if words and patterns:
            raise ValueError("give trigger words or trigger patterns, not both (as llama.cpp)")
        if words:
            patterns = ["[\\s\\S]*?(" + "|".join(_REGEX_SPECIAL.sub(lambda m: "\\" + m.group(0), w)
                                                  for w in words) + ")[\\s\\S]*"]
        self.lazy = bool(lazy)
        self.trigger_patterns = [TriggerPattern(p) for p in patterns]
        self.trigger_tokens = [int(t) for t in trigger_tokens]
        self._compiled: CompiledGrammar | None = (
            self.grammar.compile(vocab) if self.grammar is not None else None)
        self.reset()

    # -- state

    def reset(self) -> None:
        self.state = self._compiled.initial_state() if self._compiled is not None else None
        self.awaiting_trigger = self.lazy
        self._buffer = b""
        self._positions: list[tuple[int, int, int]] = []   # token, start, end in the buffer

    def clone(self) -> GrammarSampler:
        """An independent sampler in the same state (sharing the compiled grammar and its
        caches, which are read-only to it)."""
        other = object.__new__(GrammarSampler)
        other.__dict__.update(self.__dict__)
        other.__dict__.pop("_cur", None)
        other._positions = list(self._positions)
        return other

    @property
    def compiled(self) -> CompiledGrammar | None:
        """The grammar's matcher over this vocabulary (None without a grammar)."""
        return self._compiled

    @property
    def active(self) -> bool:
        """Whether the grammar constrains the next token now (a grammar, no pending trigger)."""
        return self._compiled is not None and not self.awaiting_trigger

    def can_end(self) -> bool:
        """Whether the text so far completes the grammar."""
        return self._compiled is None or self._compiled.can_end(self.state)

    # -- the sampler interface

    def apply(self, cur_p: TokenDataArray) -> None:
        if not self.active or cur_p.size == 0:
            return
        ids = None if cur_p.identity_ids else cur_p.ids
        self._compiled.apply(self.state, ids, cur_p.logits)

    def allows(self, token: int) -> bool:
        """Whether the grammar allows ``token`` next (always, when it does not constrain now)."""
        if not self.active:
            return True
        return self._compiled.check(self.state, token)

    def accept(self, token: int) -> None:
        """llama.cpp's ``llama_grammar_accept_impl``, lazy triggers included.

        Raises
        ------
        GrammarError
            The grammar cannot take ``token`` (llama.cpp aborts or throws).
        """
        if self._compiled is None:
            return
        token = int(token)
        piece = self.vocab.token_to_piece(token, 0, True)
        if self.awaiting_trigger:
            self._await(token, piece)
            return
        self.state = self._compiled.accept(self.state, token)

    def _await(self, token: int, piece: bytes) -> None:
        if token in self.trigger_tokens:
            self.awaiting_trigger = False
            self._buffer = b""
            self.state = self._compiled.accept_piece(self.state, token, piece)
            return
        start = len(self._buffer)
        self._positions.append((token, start, start + len(piece)))
        self._buffer += piece
        for pattern in self.trigger_patterns:
            at = pattern.find(self._buffer)
            if at < 0:
                continue
            self.awaiting_trigger = False
            # replay the tokens that overlap the constrained text (the first one cut)
            for tok, tok_start, tok_end in self._positions:
                if tok_end <= at:
                    continue
                self.state = self._compiled.accept_piece(
                    self.state, tok, self._buffer[max(tok_start, at):tok_end])
            self._buffer = b""
            self._positions = []
            return

    def __repr__(self) -> str:
        return (f"GrammarSampler({self.grammar!r}, lazy={self.lazy}, "
                f"awaiting_trigger={self.awaiting_trigger})")


class GrammarChain(Sampler):
    """llama.cpp's common sampler with a grammar: ``chain`` samples, the grammar checks.

    :meth:`sample` applies the chain to all candidates and checks only the selected token; when
    the grammar rejects it, the logits are reloaded, the grammar masks them and the chain samples
    again (``common_sampler_sample``). :meth:`accept` feeds the grammar, then the chain
    (``common_sampler_accept``). :meth:`apply` is the chain's alone.

    Parameters
    ----------
    chain
        The sampler chain (``common_sampler`` without a grammar).
    grammar
        The grammar sampler.
    """

    name = "chain"

    def __init__(self, chain: Any, grammar: GrammarSampler) -> None:
        self.chain = chain
        self.grammar = grammar
        self.n_rejected = 0   # samples the grammar rejected (each cost a full mask)

    @property
    def samplers(self) -> list[Sampler]:
        return self.chain.samplers

    def apply(self, cur_p: TokenDataArray) -> None:
        self.chain.apply(cur_p)

    def accept(self, token: int) -> None:
        self.grammar.accept(token)
        self.chain.accept(token)

    def reset(self) -> None:
        self.grammar.reset()
        self.chain.reset()
        self.n_rejected = 0

    def clone(self) -> GrammarChain:
        return GrammarChain(self.chain.clone(), self.grammar.clone())

    def sample(self, ctx: LogitsSource, idx: int = -1) -> int:
        cur_p = self._candidates(ctx, idx)
        self.chain.apply(cur_p)
        token = self._selected(cur_p)
        if self.grammar.active:
            start = time.perf_counter_ns()
            allowed = self.grammar.allows(token)
            self._time(start)
            if not allowed:
                self.n_rejected += 1
                cur_p.load_logits(ctx.get_logits_ith(idx))
                start = time.perf_counter_ns()
                self.grammar.apply(cur_p)
                self._time(start)
                self.chain.apply(cur_p)
                token = self._selected(cur_p)
        self.accept(token)
        return token

    def _time(self, start: int) -> None:
        if not self.chain.no_perf:   # llama.cpp counts the grammar in the sampling time
            self.chain._t_sample_ns += time.perf_counter_ns() - start

    def perf(self) -> dict:
        return self.chain.perf()

    def get_seed(self) -> int:
        return self.chain.get_seed()

    def __len__(self) -> int:
        return len(self.chain)

    def __repr__(self) -> str:
        return f"GrammarChain({self.chain!r}, {self.grammar!r})"


def grammar_sampler(vocab: GrammarVocab, grammar: Grammar | str, *, lazy: bool = False,
                    triggers: Sequence[GrammarTrigger] = ()) -> GrammarSampler:
    """The grammar sampler ``common_sampler_init`` makes from its parameters (root ``root``;
    triggers turned into patterns and tokens as llama.cpp turns them)."""
    patterns = [p for t in triggers if (p := t.as_pattern()) is not None]
    tokens = [t.token for t in triggers if t.type == "token"]
    if not lazy:
        return GrammarSampler(vocab, grammar)
    return GrammarSampler(vocab, grammar, lazy=True, trigger_patterns=patterns,
                          trigger_tokens=tokens)

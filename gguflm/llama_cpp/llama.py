"""llama-cpp-python's ``Llama`` on gguflm: :class:`gguflm.LLM` plus the low-level API that class
keeps (``eval``, ``sample``, ``generate``, ``input_ids``/``scores``/``n_tokens``, ``save_state``/
``load_state``, prompt caches, its seed chain and chat formats), with its constructor defaults.

The token bookkeeping is the LLM's own: ``n_tokens`` and ``input_ids`` are the tokens sequence 0's
KV cache holds, so ``eval`` followed by ``create_completion`` reuses the evaluated prefix, and the
other way round. What llama-cpp-python does, this does, in its order: ``generate`` reuses the
longest cached prefix (sampling at once when the whole prompt is cached with live logits, else
decoding again from the last prompt token), ``create_completion`` loads a cached state that shares
more of the prompt than the context does and saves its state after the reply, and a request without
a seed takes ``random.Random(previous seed).randint(0, 2**32)``.
"""

from __future__ import annotations

import abc
import inspect
import random
from collections import deque
from collections.abc import Callable, Generator, Iterator, Mapping, Sequence
from os import PathLike
from typing import Any

import numpy as np
import numpy.typing as npt

from gguflm.batch import Batch
from gguflm.errors import Error
from gguflm.llama_cpp import llama_chat_format
from gguflm.llama_cpp.llama_cache import BaseLlamaCache, common_prefix
from gguflm.llama_cpp.llama_speculative import LlamaDraftModel
from gguflm.llama_cpp.state import LlamaState
from gguflm.llama_cpp.stopping import LogitsProcessorList, StoppingCriteriaList
from gguflm.llm import LLM, ChatPrompt
from gguflm.models.base import REGISTRY

__all__ = ["Llama", "LlamaState", "LLAMA_DEFAULT_SEED"]

LLAMA_DEFAULT_SEED = 0xFFFFFFFF


class _ContextHandle:
    """llama-cpp-python's ``Llama._ctx`` (its context wrapper): ``.ctx`` is the gguflm Context, or
    the Model of a vocabulary-only Llama (which has no context)."""

    def __init__(self, ctx: Any):
        self.ctx = ctx


class Llama(LLM):
    """``llama_cpp.Llama``: the same arguments and defaults (``n_ctx=512``, ``seed`` =
    LLAMA_DEFAULT_SEED, ``logits_all=False``, ...), the same methods and results.

    ``vocab_only=True`` loads the vocabulary and metadata only (tokenize, detokenize, metadata).
    ``chat_format`` names one of llama-cpp-python's formats (:mod:`.llama_chat_format`); without
    one, as llama-cpp-python: a model template it recognises by name, else the model's own
    template, else ``llama-2``. ``draft_model`` proposes tokens ``generate`` and the completions
    check in one batch (:mod:`gguflm.speculative`).
    ``chat_handler`` and ``tokenizer`` (custom handlers and Hugging Face tokenizers) are not
    supported (ValueError).
    """

    def __init__(self, model_path: str | PathLike[str], *, vocab_only: bool = False, seed: int = LLAMA_DEFAULT_SEED,
                 n_ctx: int = 512, n_batch: int = 512, n_ubatch: int = 512, logits_all: bool = False,
                 embedding: bool = False, pooling_type: int = -1, type_k: int | str | None = None,
                 type_v: int | str | None = None, last_n_tokens_size: int = 64, chat_format: str | None = None,
                 chat_handler: Any = None, draft_model: LlamaDraftModel | None = None, tokenizer: Any = None,
                 attention_type: int = -1, verbose: bool = True, **kwargs: Any) -> None:
        for name, value in (("chat_handler", chat_handler), ("tokenizer", tokenizer)):
            if value is not None:
                raise ValueError(f"{name} is not supported by gguflm.llama_cpp.Llama")
        if attention_type != -1:   # LLAMA_ATTENTION_TYPE_UNSPECIFIED: the model's own
            raise ValueError("attention_type other than LLAMA_ATTENTION_TYPE_UNSPECIFIED is not supported")
        super().__init__(model_path, n_ctx=n_ctx, n_batch=n_batch, n_ubatch=n_ubatch,
                         type_k="f16" if type_k is None else type_k, type_v="f16" if type_v is None else type_v,
                         embedding=embedding, pooling_type=None if pooling_type == -1 else pooling_type,
                         vocab_only=vocab_only, last_n_tokens_size=last_n_tokens_size, draft_model=draft_model,
                         **kwargs)
        self.verbose = verbose
        self._seed = seed
        self._logits_all = logits_all or draft_model is not None   # drafted tokens are sampled row by row
        self.draft_model = draft_model
        self.cache: BaseLlamaCache | None = None
        self._requires_eval = True
        self._chain: Any = None   # the sampler chain of the generate() in progress
        self.chat_format = self._pick_chat_format(chat_format)
        self._ctx_handle = _ContextHandle(self.model if vocab_only else self.context)
        if not vocab_only:
            rows = self.context.n_ctx
            self.scores: npt.NDArray[np.single] = np.zeros((rows, self.n_vocab()), np.single)  # pages on first touch

    # -- what llama-cpp-python exposes

    @property
    def _ctx(self) -> _ContextHandle:
        return self._ctx_handle

    @property
    def ctx(self) -> Any:
        """llama-cpp-python's context handle: here the gguflm Context (the Model when vocab_only)."""
        return self._ctx_handle.ctx

    @property
    def n_tokens(self) -> int:
        return len(self._session.tokens)

    @n_tokens.setter
    def n_tokens(self, n: int) -> None:
        del self._session.tokens[n:]

    @property
    def input_ids(self) -> npt.NDArray[np.intc]:
        """The tokens the context holds, in an array of n_ctx."""
        ids = np.zeros(self.context.n_ctx, np.intc)
        ids[:self.n_tokens] = self._session.tokens
        return ids

    @property
    def _input_ids(self) -> npt.NDArray[np.intc]:
        return np.asarray(self._session.tokens, dtype=np.intc)

    @property
    def _scores(self) -> npt.NDArray[np.single]:
        return self.scores[:self.n_tokens]

    @property
    def eval_tokens(self) -> deque[int]:
        return deque(self._session.tokens, maxlen=self.context.n_ctx)

    @property
    def eval_logits(self) -> deque[list[float]]:
        return deque(self._scores.tolist(), maxlen=self.context.n_ctx if self._logits_all else 1)

    @property
    def _is_recurrent(self) -> bool:
        return self._memory == "recurrent"

    @property
    def _is_hybrid(self) -> bool:
        return self._memory == "hybrid"

    @property
    def _memory(self) -> str:
        """What the context keeps (gguflm.models' Architecture.memory), also for a vocabulary-only
        load of an architecture gguflm knows."""
        arch = REGISTRY.get(self.model.arch)
        return "attention" if arch is None else arch.memory

    def tokenizer(self) -> LlamaTokenizer:
        return LlamaTokenizer(self)

    def detokenize(self, tokens: Sequence[int], prev_tokens: Sequence[int] | None = None,
                   special: bool = False) -> bytes:
        """The bytes of ``tokens`` (``prev_tokens`` is accepted, as llama-cpp-python's)."""
        return super().detokenize(tokens, special=special)

    def token_nl(self) -> int:
        return self.model.vocab.nl if self.model.vocab.nl is not None else -1

    def set_cache(self, cache: BaseLlamaCache | None) -> None:
        self.cache = cache

    def set_seed(self, seed: int) -> None:
        self._seed = seed

    @staticmethod
    def longest_token_prefix(a: Sequence[int], b: Sequence[int]) -> int:
        return common_prefix(a, b)

    @staticmethod
    def logits_to_logprobs(logits: npt.ArrayLike, axis: int = -1) -> npt.NDArray[np.single]:
        """Log-softmax in float32 (a non-finite maximum counts as 0)."""
        logits = np.asarray(logits)
        top = np.amax(logits, axis=axis, keepdims=True)
        top = np.where(np.isfinite(top), top, 0)
        shifted = np.subtract(logits, top, dtype=np.single)
        with np.errstate(divide="ignore"):
            return shifted - np.log(np.sum(np.exp(shifted), axis=axis, keepdims=True))

    # -- the low-level loop

    def reset(self) -> None:
        """Forget the evaluated tokens (the next ``eval`` overwrites the cache from position 0)."""
        self._session.tokens.clear()
        self._requires_eval = True
        if self._is_recurrent or self._is_hybrid:
            self.context.memory.clear()

    def eval(self, tokens: Sequence[int]) -> None:
        """Decode ``tokens`` after the ``n_tokens`` held, ``n_batch`` at a time (every row an output
        with ``logits_all``, else each batch's last)."""
        ctx = self.context
        ctx.memory.seq_rm(0, self.n_tokens, -1)
        tokens = [int(t) for t in tokens]
        for start in range(0, len(tokens), self.n_batch):
            chunk = tokens[start:start + self.n_batch]
            n_past = self.n_tokens
            batch = Batch(len(chunk))
            for i, tok in enumerate(chunk):
                batch.add(tok, n_past + i, [0], self._logits_all or i == len(chunk) - 1)
            status = ctx.decode(batch)
            if status != 0:
                raise RuntimeError(f"llama_decode returned {status}")
            if self._logits_all:
                self.scores[n_past:n_past + len(chunk)] = ctx.get_logits()
            else:
                self.scores[n_past + len(chunk) - 1] = ctx.get_logits_ith(-1)
            self._session.tokens.extend(chunk)
            self._requires_eval = False

    def _sampling_chain(self, top_k: int, top_p: float, min_p: float, typical_p: float, temp: float,
                        repeat_penalty: float, frequency_penalty: float, presence_penalty: float,
                        mirostat_mode: int, mirostat_eta: float, mirostat_tau: float, grammar: Any) -> Any:
        return self._sampler(temperature=temp, top_k=top_k, top_p=top_p, min_p=min_p, repeat_penalty=repeat_penalty,
                             seed=self._seed, typical_p=typical_p, frequency_penalty=frequency_penalty,
                             presence_penalty=presence_penalty, mirostat_mode=mirostat_mode,
                             mirostat_tau=mirostat_tau, mirostat_eta=mirostat_eta, grammar=grammar)

    def sample(self, top_k: int = 40, top_p: float = 0.95, min_p: float = 0.05, typical_p: float = 1.0,
               temp: float = 0.80, repeat_penalty: float = 1.0, frequency_penalty: float = 0.0,
               presence_penalty: float = 0.0, tfs_z: float = 1.0, mirostat_mode: int = 0, mirostat_eta: float = 0.1,
               mirostat_tau: float = 5.0, penalize_nl: bool = True,
               logits_processor: LogitsProcessorList | None = None, grammar: Any = None,
               idx: int | None = None) -> int:
        """A token from the logits of position ``idx`` (default: the last evaluated), through the
        chain of the generate() in progress or, outside one, a chain for this call."""
        if self.n_tokens <= 0:
            raise ValueError("sample() needs evaluated tokens (eval() first)")
        chain = self._chain or self._sampling_chain(top_k, top_p, min_p, typical_p, temp, repeat_penalty,
                                                    frequency_penalty, presence_penalty, mirostat_mode,
                                                    mirostat_eta, mirostat_tau, grammar)
        row_index = idx - self.n_tokens if idx is not None else -1
        if logits_processor:
            row = self.context.get_logits_ith(row_index)
            if row is None:
                raise ValueError(f"no logits at position {idx}")
            ids = self._input_ids
            for processor in logits_processor:
                row[:] = processor(ids, row)
        return chain.sample(self.context, row_index)

    def generate(self, tokens: Sequence[int], top_k: int = 40, top_p: float = 0.95, min_p: float = 0.05,
                 typical_p: float = 1.0, temp: float = 0.80, repeat_penalty: float = 1.0, reset: bool = True,
                 frequency_penalty: float = 0.0, presence_penalty: float = 0.0, tfs_z: float = 1.0,
                 mirostat_mode: int = 0, mirostat_tau: float = 5.0, mirostat_eta: float = 0.1,
                 penalize_nl: bool = True, logits_processor: LogitsProcessorList | None = None,
                 stopping_criteria: StoppingCriteriaList | None = None, grammar: Any = None
                 ) -> Generator[int, Sequence[int] | None, None]:
        """Tokens after ``tokens``, one per iteration, for as long as the caller iterates (a value
        sent in is decoded after the yielded token)."""
        self._chain = self._sampling_chain(top_k, top_p, min_p, typical_p, temp, repeat_penalty, frequency_penalty,
                                           presence_penalty, mirostat_mode, mirostat_eta, mirostat_tau, grammar)
        tokens = [int(t) for t in tokens]
        if reset and self.n_tokens > 0:
            held = common_prefix(self._session.tokens, tokens)
            consumed = held == len(tokens)
            if consumed and self.n_tokens == len(tokens) and not self._requires_eval:
                reset, tokens, keep = False, [], 0      # the whole prompt's logits are live: sample at once
            else:
                keep = held - 1 if consumed else held   # decode at least the last prompt token again
            # as llama-cpp-python, every sequence's tail at once: a recurrent memory refuses it,
            # and the prompt is evaluated afresh
            if keep > 0 and self.context.memory.seq_rm(-1, keep, -1):
                reset, tokens = False, tokens[keep:]
                self.n_tokens = keep
                self._requires_eval = True
        if reset:
            self.reset()
        sample_idx = self.n_tokens + len(tokens) - 1
        try:
            while True:
                self.eval(tokens)
                while sample_idx < self.n_tokens:
                    token = self.sample(idx=sample_idx, logits_processor=logits_processor)
                    sample_idx += 1
                    if stopping_criteria is not None and stopping_criteria(
                            self._input_ids[:sample_idx], self.scores[sample_idx - 1]):
                        return
                    sent = yield token
                    tokens = [token, *(sent or ())]
                    if sample_idx < self.n_tokens and token != self._session.tokens[sample_idx]:
                        # a drafted token the model did not take: drop it and what followed
                        self.n_tokens = sample_idx
                        self.context.memory.seq_rm(0, sample_idx, -1)
                        self._requires_eval = True
                        break
                if self.draft_model is not None:
                    room = self.context.n_ctx - self.n_tokens - len(tokens)
                    drafted = self.draft_model(np.asarray(self._session.tokens + tokens, dtype=np.intc))
                    tokens.extend(int(t) for t in np.asarray(drafted)[:max(room, 0)])
        finally:
            self._chain = None

    # -- completions, with the prompt cache and the seed chain

    def _next_seed(self, seed: int | None) -> int:
        """A request's seed: the given one, else ``random.Random(previous).randint(0, 2**32)``; it
        becomes the previous one."""
        self._seed = seed if seed is not None else random.Random(self._seed).randint(0, 2**32)
        return self._seed

    def create_completion(self, *args: Any, **kwargs: Any) -> Any:
        """:meth:`gguflm.LLM.create_completion`, with llama-cpp-python's prompt cache and seed chain."""
        call = inspect.signature(LLM.create_completion).bind(self, *args, **kwargs)
        call.arguments["seed"] = self._next_seed(call.arguments.get("seed"))
        return LLM.create_completion(*call.args, **call.kwargs)

    __call__ = create_completion

    def create_chat_completion(self, *args: Any, **kwargs: Any) -> Any:
        """:meth:`gguflm.LLM.create_chat_completion` through ``self.chat_format``, with llama-cpp-
        python's prompt cache and seed chain."""
        call = inspect.signature(LLM.create_chat_completion).bind(self, *args, **kwargs)
        call.arguments["seed"] = self._next_seed(call.arguments.get("seed"))
        return LLM.create_chat_completion(*call.args, **call.kwargs)

    def _run_prepared(self, prepared: Any, stream: bool) -> Any:
        tokens = prepared.tokens
        if self.cache is not None:
            try:
                item = self.cache[tokens]
            except KeyError:
                item = None
            if item is not None and common_prefix(item.input_ids.tolist(), tokens) > \
                    common_prefix(self._session.tokens, tokens):
                self.load_state(item)
        result = super()._run_prepared(prepared, stream)
        if stream:
            return self._saving_stream(result, tokens)
        self._save_to_cache(tokens)
        return result

    def _saving_stream(self, chunks: Iterator[dict[str, Any]], prompt: list[int]) -> Iterator[dict[str, Any]]:
        yield from chunks
        self._save_to_cache(prompt)

    def _save_to_cache(self, prompt: list[int]) -> None:
        if self.cache is not None:
            self.cache[prompt + self._session.tokens[len(prompt):]] = self.save_state()

    def _chat_prompt(self, messages: Sequence[Mapping[str, Any]], **variables: Any) -> ChatPrompt:
        """The prompt ``self.chat_format`` builds; tokenized with BOS unless the format put it in."""
        formatter = self.chat_format if callable(self.chat_format) else \
            llama_chat_format.get_chat_format(self.chat_format)
        result = formatter(messages=list(messages), **variables)
        tokens = self.tokenize(result.prompt.encode("utf-8"), add_bos=not result.added_special, special=True)
        stop = () if result.stop is None else (result.stop,) if isinstance(result.stop, str) else tuple(result.stop)
        return ChatPrompt(tokens, tuple(s for s in stop if s), list(result.stopping_criteria or ()))

    def create_chat_completion_openai_v1(self, *args: Any, **kwargs: Any) -> Any:
        """create_chat_completion's result as the ``openai`` package's types (it must be installed)."""
        try:
            from openai.types.chat import ChatCompletion, ChatCompletionChunk
        except ImportError:
            raise ImportError("create_chat_completion_openai_v1 needs the openai package (pip install openai)") \
                from None
        if kwargs.get("stream", False):
            return (ChatCompletionChunk(**chunk) for chunk in self.create_chat_completion(*args, **kwargs))
        return ChatCompletion(**self.create_chat_completion(*args, **kwargs))

    # -- state

    def save_state(self) -> LlamaState:
        """The held tokens, their logits rows, the context's memory and the seed."""
        data = self.context.state_save()
        return LlamaState(input_ids=self.input_ids, scores=self._scores.copy(), n_tokens=self.n_tokens,
                          llama_state=data, llama_state_size=len(data), seed=self._seed)

    def load_state(self, state: LlamaState) -> None:
        """Back to ``state`` (the next ``generate`` decodes its last token again for live logits)."""
        self.context.state_load(bytes(state.llama_state))
        n = int(state.n_tokens)
        self._session.tokens[:] = np.asarray(state.input_ids[:n]).tolist()
        self.scores[:n] = state.scores[:n]
        self._requires_eval = True
        self._seed = state.seed

    # -- chat formats

    def _pick_chat_format(self, chat_format: str | None) -> Any:
        """llama-cpp-python's choice: the given name; else a model template it knows by name;
        else the model's template as a Jinja2 formatter; else llama-2."""
        if chat_format is not None:
            llama_chat_format.get_chat_format(chat_format)   # an unknown name fails here
            return chat_format
        template = self.model.meta.get("tokenizer.chat_template")
        if template is None:
            return "llama-2"
        vocab = self.model.vocab
        piece: Callable[[int | None], str] = \
            lambda tok: "" if tok is None else vocab.token_to_piece(tok, special=True).decode("utf-8", "replace")
        return llama_chat_format.Jinja2ChatFormatter(template, eos_token=piece(vocab.eos), bos_token=piece(vocab.bos),
                                                     stop_token_ids=[vocab.eos] if vocab.eos is not None else None)

    @classmethod
    def from_pretrained(cls, repo_id: str, filename: str, *, local_dir: str | PathLike[str] | None = None,
                        cache_dir: str | PathLike[str] | None = None, **kwargs: Any) -> Llama:
        """A model file from the Hugging Face hub (``huggingface_hub`` must be installed; a file the
        hub cache holds needs no network)."""
        try:
            from huggingface_hub import hf_hub_download
        except ImportError:
            raise Error("Llama.from_pretrained needs huggingface_hub (pip install huggingface_hub)") from None
        path = hf_hub_download(repo_id, filename, local_dir=local_dir, cache_dir=cache_dir)
        return cls(path, **kwargs)


# -- llama-cpp-python's tokenizer wrappers (gguflm.llama_cpp.llama_tokenizer re-exports them), beside
# the Llama they wrap and make: that module importing this one is then no import cycle


class BaseLlamaTokenizer(abc.ABC):
    @abc.abstractmethod
    def tokenize(self, text: bytes, add_bos: bool = True, special: bool = True) -> list[int]: ...

    @abc.abstractmethod
    def detokenize(self, tokens: Sequence[int], prev_tokens: Sequence[int] | None = None,
                   special: bool = False) -> bytes: ...


class LlamaTokenizer(BaseLlamaTokenizer):
    """The vocabulary of ``llama``."""

    def __init__(self, llama: Llama):
        self._llama = llama

    def tokenize(self, text: bytes, add_bos: bool = True, special: bool = True) -> list[int]:
        return self._llama.tokenize(text, add_bos=add_bos, special=special)

    def detokenize(self, tokens: Sequence[int], prev_tokens: Sequence[int] | None = None,
                   special: bool = False) -> bytes:
        return self._llama.detokenize(tokens, special=special)

    def encode(self, text: str, add_bos: bool = True, special: bool = True) -> list[int]:
        return self.tokenize(text.encode("utf-8", errors="ignore"), add_bos=add_bos, special=special)

    def decode(self, tokens: Sequence[int]) -> str:
        return self.detokenize(tokens).decode("utf-8", errors="ignore")

    @classmethod
    def from_ggml_file(cls, path: str) -> LlamaTokenizer:
        return cls(Llama(path, vocab_only=True))
